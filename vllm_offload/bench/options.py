"""What `vllm-offload bench` runs, as one typed record whose fields carry their own flag,
help, parser and bound: the command line is generated from it (as the config's flags are
from its schema), so a default or a help text lives in one place."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_offload.bench.workloads import MAX_RATE, Rate

ARM_KINDS = ("baseline", "native", "lmcache")
WORKLOADS = ("reuse", "chat", "sweep", "decode", "memory")
DEFAULT_WORKLOADS = ("reuse", "chat", "sweep", "memory")


@dataclass(frozen=True, kw_only=True)
class Arm:
    """One server under test: a label, its KV tier kind and more `serve` flags (after
    a `--` among them: more vLLM arguments)."""

    label: str
    kind: str  # one of ARM_KINDS
    flags: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Arm:
        """'native' or 'LABEL=KIND [serve flags]', e.g. 'c256=native
        --kv-offload-cpu-chunk-tokens 256'; ValueError says what is wrong."""
        label, sep, rest = text.partition("=")
        words = shlex.split(rest if sep else text)
        if not words or words[0] not in ARM_KINDS:
            raise ValueError(
                f"{text!r}: an arm is KIND or LABEL=KIND [flags], KIND one of "
                f"{', '.join(ARM_KINDS)}"
            )
        label = label.strip() if sep else words[0]
        if not label.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"{text!r}: the label may hold letters, digits, '-' and '_'")
        return cls(label=label, kind=words[0], flags=tuple(words[1:]))


def rates(text: str) -> list[Rate]:
    found: list[Rate] = []
    for item in text.split(","):
        if item in ("sync", MAX_RATE):
            found.append(None if item == "sync" else item)
            continue
        try:
            rate = float(item)
        except ValueError:
            raise ValueError(f"{item!r}: a rate is 'sync', 'max' or req/s > 0") from None
        if not rate > 0:
            raise ValueError(f"{item!r}: a rate must be > 0")
        found.append(rate)
    return found


def counts(text: str) -> list[int]:
    try:
        found = [int(item) for item in text.split(",") if item]
    except ValueError:
        raise ValueError(f"{text!r}: a comma list of whole numbers") from None
    if not found or min(found) < 1:
        raise ValueError(f"{text!r}: each must be at least 1")
    return found


def names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        found = [n for n in text.split(",") if n]
        if not found or any(n not in allowed for n in found):
            raise ValueError(f"{text!r}: choose from {', '.join(allowed)}")
        return found

    return parse


def cli(
    help: str,
    *,
    parse: Callable[[str], Any] | None = None,
    low: float | None = None,
    flag: str = "",
    metavar: str | None = None,
) -> dict[str, Any]:
    """A field's command-line face, as its metadata: ``parse`` reads the text (default:
    the default's type), ``low`` is the smallest value allowed, ``flag`` overrides the
    name made from the field's."""
    return {"help": help, "parse": parse, "low": low, "flag": flag, "metavar": metavar}


@dataclass(kw_only=True)
class BenchOptions:
    model: Path = field(metadata=cli("HF model directory", parse=Path))
    out: Path = field(default=Path("bench-results"), metadata=cli("where results go"))
    arms: list[Arm] = field(  # from --arms and --arm together (bench_cmd)
        default_factory=lambda: [
            Arm(label="baseline", kind="baseline"),
            Arm(label="native", kind="native"),
        ]
    )
    workloads: list[str] = field(
        default_factory=lambda: list(DEFAULT_WORKLOADS),
        metadata=cli(
            f"comma list of {','.join(WORKLOADS)} (default: all but decode)", parse=names(WORKLOADS)
        ),
    )
    repeats: int = field(
        default=3, metadata=cli("times each workload runs, arms interleaved", low=1)
    )
    docs: int = field(default=8, metadata=cli("reuse: documents", low=1))
    doc_tokens: int = field(default=8000, metadata=cli("reuse: tokens per document", low=1))
    settle_s: float = field(
        default=0.5,
        metadata=cli(
            "reuse: pause before each request, so the last one's copies to the CPU tier have "
            "finished",
            low=0,
            flag="--settle-seconds",
        ),
    )
    hit_concurrency: list[int] = field(
        default_factory=list,
        metadata=cli(
            "reuse: after the passes, for each N: N new documents read, the GPU prefix cache "
            "dropped (servers get VLLM_SERVER_DEV_MODE=1), the N read again at once (CPU hits) "
            "and once more (GPU hits); the GPU pool must hold N documents",
            parse=counts,
            metavar="N[,N...]",
        ),
    )
    conversations: int = field(default=4, metadata=cli("chat: conversations", low=1))
    turns: int = field(default=4, metadata=cli("chat: turns per conversation", low=1))
    turn_tokens: int = field(default=1000, metadata=cli("chat: user tokens per turn", low=1))
    rates: list[Rate] = field(
        default_factory=lambda: [None, 8.0, 32.0],
        metadata=cli(
            "sweep: comma list of 'sync', req/s (Poisson) and 'max' (closed loop)", parse=rates
        ),
    )
    rate_seconds: float = field(default=10.0, metadata=cli("sweep: seconds per rate", low=0.1))
    max_concurrency: int = field(default=64, metadata=cli("sweep: clients at rate 'max'", low=1))
    prompt_tokens: int = field(default=512, metadata=cli("sweep: prompt tokens", low=1))
    output_tokens: int = field(default=64, metadata=cli("fixed output (ignore_eos)", low=1))
    decode_batch: int = field(
        default=16, metadata=cli("decode: requests decoding side by side", low=1)
    )
    tier_gib: float = field(default=16.0, metadata=cli("CPU tier of the offload arms", low=0.1))
    pool_bytes: int | None = field(
        default=None, metadata=cli("cap the GPU KV pool (same for every arm)", parse=int, low=1)
    )
    gpu_memory_utilization: float | None = field(
        default=None,
        metadata=cli("per server (arms run side by side on one GPU)", parse=float, low=0.01),
    )
    token_ids: bool = field(
        default=False,
        metadata=cli("send token-id prompts (models served with --skip-tokenizer-init)"),
    )
    h2d_gbps: float | None = field(
        default=None,
        metadata=cli(
            "host->GPU bandwidth for the CPU-hit floor (benchmarks/pinned_memory.py)",
            parse=float,
            low=0.01,
        ),
    )
    serve_flags: list[str] = field(
        default_factory=list,
        metadata=cli(
            "more `vllm-offload serve` flags for every arm, e.g. "
            "'--kv-offload-cpu-chunk-tokens 256'",
            parse=shlex.split,
        ),
    )
    vllm_args: list[str] = field(default_factory=list)  # after `--`


def _reader(parse: Callable[[str], Any], low: float | None) -> Callable[[str], Any]:
    def read(text: str) -> Any:
        try:
            value = parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if low is not None and value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: must be at least {low:g}")
        return value

    return read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A flag for each field that has a help text; ``arms`` and ``vllm_args`` are the
    command's own."""
    for f in dataclasses.fields(BenchOptions):
        meta = f.metadata
        if "help" not in meta:
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        if f.default is False:
            parser.add_argument(flag, dest=f.name, action="store_true", help=meta["help"])
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        parse = meta["parse"] or type(f.default)
        shown = f.default not in (None, dataclasses.MISSING)  # lists say theirs in words
        text = meta["help"] + (f" (default: {f.default})" if shown else "")
        parser.add_argument(
            flag,
            dest=f.name,
            type=_reader(parse, meta.get("low")),
            required=required,
            metavar=meta.get("metavar"),
            help=text,
        )


def from_args(args: argparse.Namespace, arms: list[Arm], vllm_args: list[str]) -> BenchOptions:
    """The options as given (unset flags keep the record's defaults)."""
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(BenchOptions)
        if "help" in f.metadata and getattr(args, f.name, None) is not None
    }
    return BenchOptions(**given, arms=arms, vllm_args=vllm_args)
