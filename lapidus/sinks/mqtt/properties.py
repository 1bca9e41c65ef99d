"""The MQTT 5 PUBLISH properties of an event, encoded by hand.

Runs in the dispatcher process, once per message.  paho-mqtt's ``Properties`` object costs
about 0.4 ms a message to build and pack (attribute look-ups by name, per-byte loops): more
than everything else the sink does.  paho calls only ``pack()`` on what it is given (and
``str()`` when debug logging is on), so :class:`PackedProperties` hands it the bytes made here,
checked against paho's own encoder in tests/unit/test_mqtt_sink.py.

Properties: user properties ``Lapidus-Id`` (the event id), ``Lapidus-Backend``,
``Lapidus-Type`` and ``Lapidus-Position``; ``Content-Type: application/json``; payload format
indicator 1 (UTF-8).
"""

from __future__ import annotations

from typing import Dict, Tuple

USER_PROPERTY = 0x26
CONTENT_TYPE = 0x03
PAYLOAD_FORMAT = 0x01


def _utf8(text: str) -> bytes:
    data = text.encode("utf-8")
    return len(data).to_bytes(2, "big") + data


def _pair(name: str, value: str) -> bytes:
    return bytes((USER_PROPERTY,)) + _utf8(name) + _utf8(value)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value % 128, value // 128
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


_FIXED = (bytes((PAYLOAD_FORMAT, 1)) + bytes((CONTENT_TYPE,)) + _utf8("application/json"))


class PackedProperties:
    """Stands in for ``paho.mqtt.properties.Properties`` with the bytes already made."""

    __slots__ = ("packed", "event_id")

    def __init__(self, packed: bytes, event_id: str):
        self.packed = packed
        self.event_id = event_id

    def pack(self) -> bytes:
        return self.packed

    def __str__(self) -> str:
        return f"[Lapidus-Id={self.event_id}]"


class PropertiesBuilder:
    """Per backend: the part after the event id is the same for one (type, position)."""

    def __init__(self, backend: str):
        self.backend = backend
        self._tails: Dict[Tuple[str, str], bytes] = {}
        self._head = _utf8("Lapidus-Id")

    def build(self, event_id: str, kind: str, position: str) -> PackedProperties:
        tail = self._tails.get((kind, position))
        if tail is None:
            if len(self._tails) > 4096:
                self._tails.clear()      # one entry per transaction: keep it bounded
            tail = self._tails[(kind, position)] = (
                _pair("Lapidus-Backend", self.backend) + _pair("Lapidus-Type", kind)
                + _pair("Lapidus-Position", position) + _FIXED)
        body = bytes((USER_PROPERTY,)) + self._head + _utf8(event_id) + tail
        return PackedProperties(_varint(len(body)) + body, event_id)
