"""What ``lakehouse verify`` found: :class:`Problem` and :class:`VerifyReport`.

Its own module so that the checks of :mod:`.coverage` fill a report without
importing :mod:`.verification` (which runs them): no import circle, no
import hidden in a function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing verify found wrong: which version, which file, what."""

    version: int | None
    file: str
    message: str

    def __str__(self) -> str:
        where = f"version {self.version}" if self.version is not None else "chain"
        return f"{where}: {self.file}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    """What ``lakehouse verify`` checked and found."""

    dataset: str
    versions: int = 0
    head: str | None = None
    files_hashed: int = 0
    bytes_hashed: int = 0
    deep: bool = False
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "ok": self.ok,
            "versions": self.versions,
            "head": self.head,
            "files_hashed": self.files_hashed,
            "bytes_hashed": self.bytes_hashed,
            "deep": self.deep,
            "problems": [str(p) for p in self.problems],
            "notes": self.notes,
        }
