"""Where a model's routing came from: the model.yaml generation it follows, and a refused file.

A *generation* is one ``routing`` section of a model's model.yaml as this replica applied it: its
``digest`` (the sha256 of the section, the same on every replica that read the same file) and its
``number`` (1 for the section read at start, one more for each different section applied since,
by the watcher or a reload: local to the replica).  The routing a generation gives is a function of
the section alone (``Model.baseline``, built from no previous state), so replicas on one file agree
bucket by bucket whatever each did before.  ``source_view`` says whether the routing in force is the
generation's (``model.yaml``) or a local change made after it (an admin command, an automatic
rollback), and which file was refused (``Refused``), if any.  docs/rollout.md, section 11.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

DIGEST_CHARS = 12  # hex digits shown and exported (48 bits)


@dataclass(frozen=True)
class Generation:
    digest: str
    number: int = 1
    at: float = field(default_factory=time.time)

    def next(self, digest: str) -> "Generation":
        """The generation after this one when the section's digest is ``digest`` (itself if unchanged)."""
        if digest == self.digest:
            return self
        return replace(self, digest=digest, number=self.number + 1, at=time.time())

    @property
    def short(self) -> str:
        return self.digest[:DIGEST_CHARS]


@dataclass(frozen=True)
class Refused:
    """A model.yaml that was not applied: which bytes (file digest), why, since when."""
    digest: str
    error: str
    at: float = field(default_factory=time.time)


def source_view(gen: Generation, local: bool, reason: str, refused: Refused | None) -> dict:
    """What ``status`` says: ``from`` is ``model.yaml`` or ``local`` (a change after the generation)."""
    return {"from": "local" if local else "model.yaml", "generation": gen.number, "digest": gen.short,
            "applied_at": gen.at, "reason": reason,
            "refused": None if refused is None else {"error": refused.error, "since": refused.at,
                                                     "file_digest": refused.digest[:DIGEST_CHARS]}}
