"""One error base for everything vllm-offload refuses or cannot do, and one table from
what kind of failure it is to the CLI's exit code and the manager's HTTP status.

Every error names what is wrong (``field``: a config key, a flag, a file) and its text
says the fix. The CLI prints it and exits with the kind's code; the manager answers
``{"detail": {"field": ..., "message": ...}}`` with the kind's status.

The whole family, and the few errors that live outside it::

    VllmOffloadError (kind "input": exit 2 / 422, unless a subclass says otherwise)
    ├── FieldError(field, message)
    │   ├── ConfigError            config/schema.py      a key's value
    │   ├── PlanError              plan/records.py       the plan cannot be made
    │   ├── Refused      409       valid, but not here and now
    │   │   └── PreflightError     launch.py             vLLM would fail or misbehave here
    │   ├── Forbidden    403       only the administrator, in the file
    │   ├── Unauthenticated 401, Throttled 429, TooLarge 413, StorageFull 507  (the manager)
    ├── ModelFactsError            model_config.py       a model folder's files
    ├── PatchError                 patch_journal.py      the patch series (environment)
    ├── ServiceError     502       systemd/control.py    systemctl, journalctl, the server
    ├── InstallError               systemd/unit_files.py install-service
    └── UsageError                 cli/_common.py        a command line

    Outside it, on purpose: what the running front door meets while serving, never
    shown as a config error. Each has one place that turns it into an answer.
    Busy, Unavailable              box/residency_records.py  -> 503 (+ Retry-After) to the client
    EngineError                    box/engines.py        -> the switcher's event, then Unavailable
    ControlError                   box/control.py        -> the manager's page (states unknown) or
                                                            ServiceError for a bring-in
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

ErrorKind = Literal[
    "input",
    "refused",
    "forbidden",
    "environment",
    "service",
    "unauthenticated",
    "throttled",
    "too_large",
    "storage",
]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    exit_code: int
    http_status: int


OUTCOMES: dict[ErrorKind, Outcome] = {
    # A bad config value, flag, model directory or request body: fix the input.
    "input": Outcome(exit_code=2, http_status=422),
    # Valid, but it cannot start here and now (the host cannot hold the tier, vLLM is not
    # patched, the saved config is unusable): nothing was started or changed.
    "refused": Outcome(exit_code=2, http_status=409),
    # Only an administrator may change it, in the config file (the manager's API may not).
    "forbidden": Outcome(exit_code=2, http_status=403),
    # The machine is not as vllm-offload needs it (vLLM missing, its files modified).
    "environment": Outcome(exit_code=1, http_status=500),
    # systemctl or journalctl failed, or the server did not answer in time.
    "service": Outcome(exit_code=1, http_status=502),
    # The manager's API: no token (or a wrong one) ...
    "unauthenticated": Outcome(exit_code=2, http_status=401),
    # ... too many wrong ones from this client ...
    "throttled": Outcome(exit_code=2, http_status=429),
    # ... a request body over the limit ...
    "too_large": Outcome(exit_code=2, http_status=413),
    # ... and a save the disk could not take (the old file stays).
    "storage": Outcome(exit_code=1, http_status=507),
}


class VllmOffloadError(Exception):
    kind: ClassVar[ErrorKind] = "input"

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    @property
    def exit_code(self) -> int:
        return OUTCOMES[self.kind].exit_code

    @property
    def http_status(self) -> int:
        return OUTCOMES[self.kind].http_status

    def detail(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}

    def named(self, field: str, message: str) -> VllmOffloadError:
        """The same error (its kind: its exit code and HTTP status) under another field
        and message: a model's error as its [[models]] entry's."""
        renamed = type(self).__new__(type(self))  # not __init__: subclasses take other args
        renamed.__dict__.update(self.__dict__)
        Exception.__init__(renamed, f"{field}: {message}" if field else message)
        renamed.field, renamed.message = field, message
        return renamed


class FieldError(VllmOffloadError):
    """An error about one named field: ``FieldError(field, message)``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


class Refused(FieldError):
    kind = "refused"


class Forbidden(FieldError):
    kind = "forbidden"


class Unauthenticated(FieldError):
    kind = "unauthenticated"


class Throttled(FieldError):
    kind = "throttled"


class TooLarge(FieldError):
    kind = "too_large"


class StorageFull(FieldError):
    kind = "storage"
