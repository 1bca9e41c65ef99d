"""The webhook's HTTP client: one aiohttp session per backend, one POST at a time.

Runs in the dispatcher process, inside its asyncio loop; imported only when the sink starts
(aiohttp is the optional extra ``lapidus[webhook]``).  :meth:`Client.post` never raises for
what the network or the server does: it returns the :class:`.answers.Verdict`, and the sink
decides.  Credentials from the URL go as basic authentication, never into a log line.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Optional

import aiohttp

from ... import __version__
from . import answers
from .options import WebhookOptions
from .requests import Request

ANSWER_QUOTED = 200     # characters of an error answer's body kept for the reason


class Client:
    def __init__(self, options: WebhookOptions, backend: str):
        self.options = options
        self.url = options.bare_url
        context: Optional[ssl.SSLContext] = None
        if options.tls_ca_file:
            context = ssl.create_default_context(cafile=options.tls_ca_file)
        # One connection kept alive is all a sequential poster needs; DNS is cached by aiohttp.
        connector = aiohttp.TCPConnector(limit=4, ssl=context if context is not None else True)
        credentials = options.credentials
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=options.timeout,
                                          sock_connect=options.connect_timeout),
            auth=aiohttp.BasicAuth(*credentials) if credentials else None,
            headers={"Content-Type": "application/json",
                     "User-Agent": f"lapidus/{__version__}", **options.headers},
            # the body is bytes already: nothing for aiohttp to serialise
            skip_auto_headers=("Accept-Encoding",),
        )

    async def post(self, request: Request) -> answers.Verdict:
        try:
            async with self.session.post(self.url, data=request.body, headers=request.headers,
                                         allow_redirects=False) as response:
                status = response.status
                if 200 <= status < 300:
                    await response.read()      # drain: the connection is reused
                    return answers.Verdict(answers.OK, "")
                text = (await response.text(errors="replace"))[:ANSWER_QUOTED].strip()
                return answers.judge(status, response.reason or "", text,
                                     response.headers.get("Retry-After"),
                                     response.headers.get("Location"))
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return answers.transport_failure(exc, self.options.timeout)

    async def close(self) -> None:
        await self.session.close()
