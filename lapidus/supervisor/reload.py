"""What a reload (SIGHUP) changes: which backends to start, stop and restart, and which
settings only a restart of Lapidus applies.

Runs in the supervisor process; pure functions of two configurations, tested without processes.
A backend is restarted when its own settings or the plugins it uses (global ones included)
changed; the others keep streaming.  The dispatcher is never restarted by a reload: a worker
tells it its plugins when it connects, and it builds that backend's sinks anew when they differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping


@dataclass
class ReloadPlan:
    backends: Dict[str, object]                           # the new enabled backends by name
    added: List[str] = field(default_factory=list)
    removed: List[str] = field(default_factory=list)
    changed: List[str] = field(default_factory=list)
    not_applied: List[str] = field(default_factory=list)  # settings that need a restart
    supervisor_changed: bool = False

    @classmethod
    def between(cls, old, new, live: Mapping[str, object]) -> "ReloadPlan":
        """``old`` and ``new`` are configurations; ``live`` the backends running now (by name,
        as configured in ``old``)."""
        backends = {b.name: b for b in new.backends if b.options.get("enabled", True)}
        plan = cls(backends=backends)
        plan.added = [name for name in backends if name not in live]
        plan.removed = [name for name in live if name not in backends]
        plan.changed = [name for name, backend in backends.items() if name in live and (
            backend != live[name] or new.plugins_for(backend) != old.plugins_for(live[name]))]
        if old.state_dir != new.state_dir:
            plan.not_applied.append("state_dir")
        if old.control != new.control:
            plan.not_applied.append("control.socket")
        if (old.http and old.http.listen) != (new.http and new.http.listen):
            plan.not_applied.append("http.listen")   # a token change is applied (Arbiter.reload)
        if old.log != new.log:
            # children started from now on get the new ones; the supervisor keeps its own
            plan.not_applied.append("log (for the supervisor and the running children)")
        plan.supervisor_changed = old.supervisor != new.supervisor
        return plan
