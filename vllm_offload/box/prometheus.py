"""Several Prometheus text expositions as one: each metric family once (its HELP and TYPE
lines), with every engine's samples under it. vLLM labels its samples with the model's
name, so the engines' series stay apart; a plain concatenation would repeat families,
which Prometheus (and the manager's parser) reject."""

from __future__ import annotations


def merge_expositions(texts: list[str]) -> str:
    headers: dict[str, list[str]] = {}  # family -> its # HELP / # TYPE lines
    samples: dict[str, list[str]] = {}  # family -> sample lines, every text's
    for text in texts:
        family = ""
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                words = line.split(None, 3)
                if len(words) >= 3 and words[1] in ("HELP", "TYPE"):
                    family = words[2]
                    known = headers.setdefault(family, [])
                    if not any(h.split(None, 2)[1] == words[1] for h in known):
                        known.append(line)
                    samples.setdefault(family, [])
                continue
            samples.setdefault(family, []).append(line)
    out = []
    for family, lines in samples.items():
        out += headers.get(family, [])
        out += lines
    return "\n".join(out) + "\n" if out else ""
