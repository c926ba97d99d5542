"""What the checks found besides errors (errors are raised): warning lines for legal but suspicious settings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Findings:
    warnings: list[str] = field(default_factory=list)

    def warn(self, line: str) -> None:
        self.warnings.append(line)
