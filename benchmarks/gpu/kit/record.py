"""The JSON an experiment writes as it goes: its options, then whatever it adds; saved
whole after each step (a call cut by its time limit keeps what was measured)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Record(dict[str, Any]):
    def __init__(self, path: Path, options: dict[str, Any]) -> None:
        super().__init__(
            options={k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
        )
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        part = self.path.with_suffix(".part")
        part.write_text(json.dumps(self, indent=1) + "\n")
        os.replace(part, self.path)
