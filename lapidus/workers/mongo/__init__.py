"""MongoDB backend: change streams to events (see docs/mongodb.md).

Modules, one job each: :mod:`.settings` (options, pymongo client), :mod:`.errors` (failures
phrased for the operator), :mod:`.position` (resume tokens, checkpoints), :mod:`.pipeline`
(filter push-down), :mod:`.bson_json` (BSON values to JSON), :mod:`.changes` (change documents
to events) and :mod:`.source` (the :class:`MongoSource` the worker runs).
"""

from .source import MongoSource

__all__ = ["MongoSource"]
