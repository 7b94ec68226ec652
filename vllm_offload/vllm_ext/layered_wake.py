"""A layered wake (issue #58, residency.layered_wake): the first step after a level-1 wake
starts while the weights are still coming back, each layer waiting on the GPU only for
the copies it reads, so the request's way in and its forward hide behind the copy.

vLLM's worker maps and copies everything in ``wake_up`` (our arena backend's ``resume``)
and then synchronizes the device. This worker, chosen by module path (``--worker-cls``:
an extension point, no hunk), asks the backend to hold the weights back in that
``resume``, lets vLLM's wake end, and then maps each weight allocation and queues its
copy on a side stream in the order of vllm_ext/wake_order.py, an event after each
layer's. Until its first forward has passed every layer:

- vLLM's CUDA-graph dispatcher is asked for no full graph (the first step is a prefill,
  piecewise anyway; a one-token step runs piecewise once), and the step's stream waits
  for the embedding's and the first layer's copies before the step;
- each attention layer (run eagerly between the graph's pieces: vLLM's
  ``unified_attention_with_output`` calls ``layer.impl.forward``) makes the stream wait
  for the copies of the piece after it; the last layer's waits for all.

The host never waits. A put-away before any step needs nothing more (vLLM's sleep
synchronizes the device first); it takes the waits down. Models whose attention layers
are not ``layers.N``, and engines with a draft model, wake whole (logged once). Runs
inside vLLM's worker process; imports vLLM's GPU worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import torch
from vllm.config import CUDAGraphMode
from vllm.logger import init_logger
from vllm.v1.worker.gpu_worker import Worker

from vllm_offload.vllm_ext import wake_order
from vllm_offload.vllm_ext.sleep import ArenaBackend, Saved

logger = init_logger("vllm.vllm_offload.layered_wake")


class StepWaits:
    """The first step's waits, installed on vLLM's dispatcher and attention impls until
    the last attention layer has asked for the last copy. ``wait`` makes the current
    stream wait for an event (never the host)."""

    def __init__(
        self,
        events: Sequence[Any],
        first: int,
        per_layer: dict[str, int],
        wait: Callable[[Any], None],
    ) -> None:
        self._events, self._first, self._per_layer, self._wait = events, first, per_layer, wait
        self._undo: list[Callable[[], None]] = []

    def install(self, dispatcher: Any, attention: dict[str, Any]) -> None:
        dispatch = dispatcher.dispatch

        def dispatch_piecewise(*args: Any, **kwargs: Any) -> Any:
            valid = kwargs.get("valid_modes")
            invalid = set(kwargs.get("invalid_modes") or ())
            if not valid or set(valid) - invalid - {CUDAGraphMode.FULL}:
                kwargs["invalid_modes"] = invalid | {CUDAGraphMode.FULL}
            mode, batch = dispatch(*args, **kwargs)
            # A full graph runs no Python per layer: where one was the only choice left,
            # the step waits for every copy before it.
            self._wait(self._events[-1 if mode == CUDAGraphMode.FULL else self._first])
            return mode, batch

        dispatcher.dispatch = dispatch_piecewise
        self._undo.append(lambda: vars(dispatcher).pop("dispatch", None))
        for name, layer in attention.items():
            self._wrap(name, layer.impl)

    def _wrap(self, name: str, impl: Any) -> None:
        forward, event = impl.forward, self._events[self._per_layer[name]]
        last = self._per_layer[name] == len(self._events) - 1

        def forward_then_wait(*args: Any, **kwargs: Any) -> Any:
            result = forward(*args, **kwargs)
            self._wait(event)  # before the piece after this layer's attention
            if last:
                self.remove()
            return result

        impl.forward = forward_then_wait
        self._undo.append(lambda: vars(impl).pop("forward", None))

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


class LayeredWakeWorker(Worker):
    """vLLM's GPU worker whose level-1 wake returns before the weights' copies end."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._order: tuple[list[tuple[int, ...]], int, dict[str, int]] | None = None
        self._why_whole: str | None = None
        self._waits: StepWaits | None = None

    def sleep(self, level: int = 1) -> None:
        if self._waits is not None:  # woken, put away before any step: vLLM syncs first
            self._waits.remove()
            self._waits = None
        super().sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        backend = self.sleep_mode_backend
        if not isinstance(backend, ArenaBackend) or self._layers() is None:
            super().wake_up(tags)
            return
        backend.hold_weights = True
        try:
            super().wake_up(tags)
        finally:
            backend.hold_weights = False
        if backend.held:
            held, backend.held = backend.held, []
            self._copy_layer_by_layer(backend, held)

    def _layers(self) -> dict[str, Any] | None:
        """The attention layers by name, or None (logged once) where this engine wakes
        whole."""
        context = self.vllm_config.compilation_config.static_forward_context
        attention = {name: layer for name, layer in context.items() if hasattr(layer, "impl")}
        why = None
        if self.vllm_config.speculative_config is not None:
            why = "a draft model's layers are not in the order"
        elif len(attention) != len(context) or wake_order.attention_layers(attention) is None:
            why = "its layers are not all attention layers named layers.N"
        if why is not None and why != self._why_whole:
            logger.info("vllm-offload layered wake: this engine wakes whole (%s)", why)
        self._why_whole = why
        return None if why else attention

    def _copy_layer_by_layer(self, backend: ArenaBackend, held: list[Saved]) -> None:
        attention = self._layers()
        assert attention is not None
        by_address = {saved.ptr: saved for saved in held}
        if self._order is None or set(by_address) != set(chain(*self._order[0])):
            self._order = self._ordered(attention, held)  # the same allocations each wake
        groups, first, per_layer = self._order
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        events = []
        for group in groups:
            for address in group:
                backend.map_and_copy(by_address[address], stream.cuda_stream)
            events.append(torch.cuda.Event())  # type: ignore[no-untyped-call]
            events[-1].record(stream)
        self._waits = StepWaits(events, first, per_layer, _current_stream_waits)
        self._waits.install(self.model_runner.cudagraph_dispatcher, attention)

    def _ordered(
        self, attention: dict[str, Any], held: list[Saved]
    ) -> tuple[list[tuple[int, ...]], int, dict[str, int]]:
        """The held allocations' addresses in copy groups, and the step's waits."""
        layers = wake_order.attention_layers(attention)
        assert layers is not None
        model = self.model_runner.model
        tensors = chain(model.named_parameters(), model.named_buffers())
        groups = wake_order.copy_groups(
            [(saved.ptr, saved.size) for saved in held],
            ((name, tensor.data_ptr()) for name, tensor in tensors),
            max(layers.values()),
        )
        first, per_layer = wake_order.waits(groups, layers)
        addresses = [tuple(held[index].ptr for index in group.allocations) for group in groups]
        return addresses, first, per_layer


def _current_stream_waits(event: Any) -> None:
    torch.cuda.current_stream().wait_event(event)
