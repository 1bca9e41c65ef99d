"""pymongo failures phrased for the operator: the thing, the reason, the fix.

Runs in the mongo worker process.  Every message starts with the backend name, names the server
without its password (:attr:`MongoSettings.where`) and says whether retrying can help
(``fatal=True``: the supervisor marks the backend FATAL instead of restarting it in a loop).
"""

from __future__ import annotations

import re

from pymongo.errors import (ConfigurationError, ConnectionFailure, OperationFailure,
                            PyMongoError)

from ..base import BackendError
from .settings import MongoSettings

# Server error codes (src/mongo/base/error_codes.yml in the MongoDB sources).
NO_MATCHING_DOCUMENT = 47          # fullDocument / fullDocumentBeforeChange "required", no image
UNAUTHORIZED = 13
AUTHENTICATION_FAILED = 18
INVALID_RESUME_TOKEN = 260
CHANGE_STREAM_FATAL = 280
CHANGE_STREAM_HISTORY_LOST = 286
NOT_A_REPLICA_SET = 40573          # "The $changeStream stage is only supported on replica sets"
UNKNOWN_FIELD = 40415              # e.g. fullDocumentBeforeChange sent to MongoDB < 6.0
# Before 4.4 (and in some 4.x paths) a vanished resume point was reported with these codes.
_OLD_HISTORY_LOST = frozenset({40576, 40585})

REPLICA_SET_FIX = (
    "start mongod with --replSet rs0 (or replication.replSetName: rs0 in mongod.conf), "
    "run rs.initiate() once in mongosh, and set replica_set = \"rs0\" for this backend "
    "(a single-node replica set is enough)")


def is_history_lost(exc: BaseException) -> bool:
    """The resume point is older than the oldest oplog entry (ChangeStreamHistoryLost)."""
    if not isinstance(exc, OperationFailure):
        return False
    if exc.code == CHANGE_STREAM_HISTORY_LOST or exc.code in _OLD_HISTORY_LOST:
        return True
    message = str((exc.details or {}).get("errmsg", exc))
    return "no longer be in the oplog" in message


def not_a_replica_set(settings: MongoSettings) -> BackendError:
    return BackendError(
        f'backend "{settings.backend}": MongoDB at {settings.where} is not a replica set, and '
        f"change streams only exist on replica sets and sharded clusters; {REPLICA_SET_FIX}",
        fatal=True)


def history_lost(settings: MongoSettings, position: str, reason: str) -> BackendError:
    """The ``history_lost = "fail"`` outcome."""
    return BackendError(
        f'backend "{settings.backend}": cannot resume the change stream at {settings.where} '
        f"after position {position}: {reason} (ChangeStreamHistoryLost: the oplog no longer "
        "holds that point, so the changes made since the last delivered one are gone). "
        'Set history_lost = "restart_from_now" to continue from now after a "gap" event, '
        "and size the oplog (replSetResizeOplog) so it outlives Lapidus outages",
        fatal=True)


def describe(settings: MongoSettings, exc: BaseException, doing: str) -> BackendError:
    """Any pymongo exception raised while ``doing`` (``"connecting"``, ``"reading changes"``)."""
    name = settings.backend
    where = settings.where
    reason = settings.redact(_short_reason(exc))
    if isinstance(exc, OperationFailure):
        code = exc.code
        if code == AUTHENTICATION_FAILED:
            source = settings.effective_auth_source
            in_db = f' (authSource "{source}")' if source else ""
            return BackendError(
                f'backend "{name}": MongoDB at {where} rejected the credentials of user '
                f'"{settings.user}"{in_db}: {reason}; check user and password, and set '
                "auth_source to the database the user was created in", fatal=True)
        if code == UNAUTHORIZED:
            scope = (f'database "{settings.database}"' if settings.database
                     else "the whole deployment")
            role = (f'"read" on database "{settings.database}"' if settings.database
                    else '"readAnyDatabase" on admin')
            return BackendError(
                f'backend "{name}": user "{settings.user}" may not open a change stream on '
                f"{scope} at {where}: {reason}; grant it the role {role} (change streams "
                "need the find and changeStream actions)", fatal=True)
        if code == NOT_A_REPLICA_SET:
            return not_a_replica_set(settings)
        if code == NO_MATCHING_DOCUMENT:
            return BackendError(
                f'backend "{name}": {reason}; a "required" full_document or '
                "full_document_before_change needs pre- and post-images on every watched "
                "collection: run db.runCommand({collMod: \"<collection>\", "
                "changeStreamPreAndPostImages: {enabled: true}}) for each, or use "
                '"whenAvailable"', fatal=True)
        if code == UNKNOWN_FIELD and "fullDocumentBeforeChange" in reason:
            return BackendError(
                f'backend "{name}": MongoDB at {where} does not know pre-images ({reason}); '
                'full_document_before_change needs MongoDB 6.0 or later: set it to "off" '
                "or upgrade the server", fatal=True)
        if code == INVALID_RESUME_TOKEN or code == CHANGE_STREAM_FATAL:
            return BackendError(
                f'backend "{name}": MongoDB at {where} refused the saved resume token: '
                f"{reason}; if the backend now points at another deployment, delete its "
                "checkpoint to start from now (changes made meanwhile are not streamed)",
                fatal=True)
        return BackendError(
            f'backend "{name}": MongoDB at {where} failed while {doing}: {reason} '
            f"(code {code})")
    if isinstance(exc, ConfigurationError):
        return BackendError(
            f'backend "{name}": invalid MongoDB connection settings for {where}: {reason}; '
            "fix uri, host, port, replica_set or the tls options", fatal=True)
    if isinstance(exc, ConnectionFailure):
        if "No replica set members available for replica set name" in reason:
            return BackendError(
                f'backend "{name}": no member of replica set "{settings.replica_set}" answers at '
                f"{where}: {reason}; set replica_set to the name rs.conf() shows (or remove it), "
                "and check that the members' host names (rs.conf()) resolve from this host")
        if "certificate verify failed" in reason.lower() or "CERTIFICATE_VERIFY" in reason:
            return BackendError(
                f'backend "{name}": TLS to MongoDB at {where} failed: {reason}; set tls_ca_file '
                "to the CA that signed the server certificate (or, for tests only, "
                "tls_allow_invalid_certificates = true)", fatal=True)
        return BackendError(
            f'backend "{name}": cannot reach MongoDB at {where} while {doing}: {reason}; check '
            "that mongod runs and listens there, that the host name resolves and no firewall "
            "blocks the port" + (f', and that the replica set is named "{settings.replica_set}"'
                                 if settings.replica_set else ""))
    if isinstance(exc, PyMongoError):
        return BackendError(f'backend "{name}": MongoDB at {where} failed while {doing}: '
                            f"{reason}")
    return BackendError(f'backend "{name}": unexpected error while {doing}: {reason}')


_TIMEOUTS_NOTE = re.compile(r" \(configured timeouts: [^)]*\)")


def _short_reason(exc: BaseException) -> str:
    """The useful part of a pymongo message (server selection appends a long topology dump)."""
    if isinstance(exc, OperationFailure) and exc.details:
        message = exc.details.get("errmsg")
        if message:
            return str(message)
    text = str(exc)
    cut = text.find(", Timeout:")
    if cut > 0:
        text = text[:cut]
    return _TIMEOUTS_NOTE.sub("", text)
