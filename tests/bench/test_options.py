"""`vllm-offload bench`'s flags are generated from BenchOptions: each field's default,
bound and parser live once, in the record."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from vllm_offload.bench.options import Arm, BenchOptions, add_arguments, from_args


def parse(*argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return from_args(
        parser.parse_args(["--model", "/m", *argv]), [Arm(label="native", kind="native")], []
    )


def test_no_flags_give_the_records_defaults() -> None:
    assert parse() == BenchOptions(model=Path("/m"), arms=[Arm(label="native", kind="native")])


def test_flags_reach_their_fields() -> None:
    got = parse(
        "--settle-seconds",
        "0.2",
        "--rates",
        "sync,4,max",
        "--hit-concurrency",
        "1,8",
        "--serve-flags",
        "--kv-offload-cpu-chunk-tokens 256",
        "--token-ids",
        "--pool-bytes",
        "1024",
    )
    assert got.settle_s == 0.2 and got.rates == [None, 4.0, "max"]
    assert got.hit_concurrency == [1, 8] and got.token_ids and got.pool_bytes == 1024
    assert got.serve_flags == ["--kv-offload-cpu-chunk-tokens", "256"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("--repeats", "0"), "at least 1"),
        (("--settle-seconds", "-1"), "at least 0"),
        (("--rates", "0"), "must be > 0"),
        (("--workloads", "reuse,disk"), "choose from"),
    ],
)
def test_bad_values_name_the_bound(argv: tuple[str, ...], words: str) -> None:
    with pytest.raises(argparse.ArgumentError, match=words):
        parse(*argv)
