"""Models named by a Hugging Face repo id (``org/name``, ``org/name@revision``) instead of
a folder: fetched with ``huggingface_hub`` (the library vLLM itself uses: revisions,
resumable downloads, the shared HF cache, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT), and
planned from the files it fetched, or before any download from the hub's config.json and
safetensors headers (read with ranged requests).

A value is a hub id when it has the shape of one and names nothing on this disk (vLLM's
own rule): an existing relative folder ``org/name`` stays a folder; ``./org/name`` is
always one. ``serve`` never downloads unless asked (``serve --pull``); ``pull`` does only
the fetch. ``huggingface_hub`` is imported only when a hub id is used (it costs import
time the launcher's budget does not have).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_offload.model import facts as model_facts
from vllm_offload.model import hub_guard
from vllm_offload.model.config_json import ModelFactsError
from vllm_offload.model.facts import ModelFacts
from vllm_offload.safe_files import read_regular

# The hub's own rule for a repo's parts (letters, digits, '-', '_', '.'; at most 96
# characters; no '--' or '..'), and a revision: a branch, tag or commit.
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_HUB_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(@(?P<rev>[A-Za-z0-9][A-Za-z0-9._/-]{{0,127}}))?")
# What a pull leaves out: the weights in formats vLLM does not load here (it loads the
# safetensors), and the 'original/' copies some repos ship beside them (Llama: twice the
# download).
IGNORED = ["*.bin", "*.pt", "*.pth", "*.gguf", "*.msgpack", "*.h5", "*.onnx", "*.ot", "original/*"]


# Offline, a model is planned from a folder: its config.json alone is enough to plan.
OFFLINE_FOLDER = "offline, a folder with the model's config.json plans without the hub"


class HubUnreachable(ModelFactsError):
    """The hub did not answer (the network, HF_HUB_OFFLINE): nothing wrong with the input."""

    kind = "service"


@dataclass(frozen=True, kw_only=True)
class HubRef:
    repo_id: str
    revision: str | None  # None: the repo's default branch

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id


def shaped_like_id(value: str) -> bool:
    """Whether ``value`` has a repo id's shape (whatever the disk holds)."""
    match = _HUB_ID.fullmatch(value)
    return match is not None and ".." not in value and "--" not in match["repo"]


def hub_ref(value: str) -> HubRef | None:
    """``value`` as a hub id, or None where it is a path."""
    if not shaped_like_id(value) or os.path.lexists(value):
        return None
    repo, _, revision = value.partition("@")
    return HubRef(repo_id=repo, revision=revision or None)


def cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def cached(ref: HubRef, cache: str | None = None) -> Path | None:
    """The folder of ``ref``'s complete download in the HF cache (``cache``: another
    user's, say), or None; no network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            ref.repo_id,
            revision=ref.revision,
            local_files_only=True,
            ignore_patterns=IGNORED,
            cache_dir=cache,
        )
    except LocalEntryNotFoundError:  # none, or an incomplete one
        return None
    return Path(str(folder))


def cached_ids() -> list[str]:
    """The repo ids of the models downloaded whole into the HF cache; no network."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir().repos
    except (CacheNotFound, OSError):
        return []
    ids = sorted(r.repo_id for r in repos if r.repo_type == "model")
    return [repo for repo in ids if cached(HubRef(repo_id=repo, revision=None)) is not None]


def downloaded(ref: HubRef) -> Path:
    """``cached(ref)``, else ModelFactsError saying how to fetch it."""
    folder = cached(ref)
    if folder is None:
        raise ModelFactsError(
            f"{ref}: not downloaded yet (HF cache: {cache_dir()}); run `vllm-offload pull "
            f"{ref}` first, or start with `serve --pull`"
        )
    return folder


Progress = Callable[[int, int], None]  # bytes fetched, bytes to fetch (grows as files start)


def pull(ref: HubRef, progress: Progress | None = None) -> Path:
    """Fetch ``ref``'s config, tokenizer and safetensors weights into the HF cache (a
    dropped connection resumes where it stopped): a progress bar on stderr, or each step
    told to ``progress``."""
    from huggingface_hub import HfApi, snapshot_download

    with _hub_errors(ref):
        info = HfApi().model_info(ref.repo_id, revision=ref.revision)
        names = [s.rfilename for s in info.siblings or []]
        if not any(name.endswith(".safetensors") for name in names):
            raise ModelFactsError(
                f"{ref}: the repo has no safetensors weights (files: "
                f"{', '.join(names[:8]) or 'none'})"
            )
        bars = _recorder(progress) if progress else None
        folder = snapshot_download(
            ref.repo_id, revision=ref.revision, ignore_patterns=IGNORED, tqdm_class=bars
        )
    return Path(str(folder))


def _recorder(progress: Progress) -> Any:
    """A tqdm class for snapshot_download that draws nothing and tells ``progress`` the
    bytes of its whole-download bar (the one it names 'huggingface_hub.snapshot_download';
    a disabled tqdm counts nothing itself)."""
    from huggingface_hub.utils.tqdm import tqdm

    class Recorder(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.whole = kwargs.get("name") == "huggingface_hub.snapshot_download"
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
            self.n = kwargs.get("initial", 0)

        def update(self, n: float | None = 1) -> bool | None:
            if self.whole:
                self.n += int(n or 0)
                progress(int(self.n), int(self.total or 0))
            return None

    return Recorder


def remote_facts(ref: HubRef) -> tuple[ModelFacts, int]:
    """``ref``'s facts from the hub without downloading weights (its config.json and each
    top-level safetensors file's header), and the bytes a pull would fetch."""
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi()
    with _hub_errors(ref):
        info = api.model_info(ref.repo_id, revision=ref.revision, files_metadata=True)
        files = [s for s in info.siblings or [] if not _ignored(s.rfilename)]
        with tempfile.TemporaryDirectory() as scratch:  # not the HF cache: no partial snapshot
            config = hf_hub_download(
                ref.repo_id, "config.json", revision=info.sha, cache_dir=scratch
            )
            data = read_regular(config, model_facts.MAX_CONFIG_BYTES)
        shards = [
            s.rfilename
            for s in files
            if s.rfilename.endswith(".safetensors") and "/" not in s.rfilename
        ]
        if len(shards) > model_facts.MAX_WEIGHT_FILES:
            raise ModelFactsError(f"{ref}: more than {model_facts.MAX_WEIGHT_FILES} weight files")
        headers = {name: _header(api, ref, info.sha, name) for name in shards}
    raw = model_facts.config_object(data, f"{ref}: config.json")
    facts = model_facts.facts_of(str(ref), raw, headers or None, (info.sha or "")[:16])
    return facts, sum(s.size or 0 for s in files)


def _ignored(name: str) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(name, pattern) for pattern in IGNORED)


def _header(api: Any, ref: HubRef, sha: str | None, name: str) -> dict[str, Any]:
    """One safetensors file's header as the file holds it (tensor: dtype and shape)."""
    meta = api.parse_safetensors_file_metadata(ref.repo_id, name, revision=sha)
    return {
        tensor: {"dtype": info.dtype, "shape": list(info.shape)}
        for tensor, info in meta.tensors.items()
    }


@contextmanager
def _hub_errors(ref: HubRef) -> Iterator[None]:
    """The hub's refusals as ModelFactsError naming the id and the fix."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = hub_guard.shown(constants.ENDPOINT)
    hub_guard.install(constants.ENDPOINT)  # what the hub answers, checked before it is used
    try:
        yield
    except hub_guard.HubAnswerRefused:
        raise
    except GatedRepoError:
        raise ModelFactsError(
            f"{ref}: the repo is gated; accept its terms at {where}/"
            f"{ref.repo_id} and set HF_TOKEN to a token of that account"
        ) from None
    except RepositoryNotFoundError:
        raise ModelFactsError(
            f"{ref}: no such model on {where} (or a private one: set "
            "HF_TOKEN to a token that can read it)"
        ) from None
    except RevisionNotFoundError:
        raise ModelFactsError(f"{ref}: the repo has no revision '{ref.revision}'") from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        fix = "set HF_TOKEN to a token that can read it" if status in (401, 403) else "try again"
        raise ModelFactsError(f"{ref}: {where} answered {status}; {fix}") from None
    except OfflineModeIsEnabled:
        raise HubUnreachable(
            f"{ref}: HF_HUB_OFFLINE is set, so nothing is asked of the hub: unset it to plan "
            f"or pull from {where}; {OFFLINE_FOLDER}"
        ) from None
    except (LocalEntryNotFoundError, httpx2.TransportError) as exc:
        raise HubUnreachable(
            f"{ref}: cannot reach {where} ({hub_guard.shown(str(exc))[:200]}); check the "
            f"network and HF_ENDPOINT; {OFFLINE_FOLDER}"
        ) from None
    except OSError as exc:  # the disk (full, or the cache not writable)
        raise ModelFactsError(
            f"{ref}: fetching from {where} failed ({hub_guard.shown(str(exc))[:200]})"
        ) from None
