"""A layered wake (issue #58, residency.layered_wake): the first step after a level-1 wake
starts while the weights are still coming back, each layer waiting on the GPU only for
the copies it reads, so the request's way in and its forward hide behind the copy.

vLLM's worker maps and copies everything in ``wake_up`` (our arena backend's ``resume``)
and then synchronizes the device. This worker, chosen by module path (``--worker-cls``:
an extension point, no hunk), asks the backend to hold the weights back in that
``resume``, lets vLLM's wake end, and then maps each weight allocation and queues its
copy on a side stream in the order of vllm_ext/wake_order.py, an event after each
layer's. Until its first forward has passed every layer:

- the step's stream waits, where vLLM's CUDA-graph dispatch (model runner V1's or V2's)
  chose piecewise graphs or none, for the embedding's and the first layer's copies, and
  where it chose a full graph (no Python runs between its layers) for every copy;
- each attention layer (run eagerly between the graph's pieces: vLLM's
  ``unified_attention_with_output`` calls ``layer.impl.forward``) makes the stream wait
  for the copies of the piece after it; the last layer's waits for all.

The host never waits. A put-away before any step needs nothing more (vLLM's sleep
synchronizes the device first); it takes the waits down. A wake failing after the resume
copies what it held at once. Where the model's order is not known here (a draft model, an
encoder, quantized weights, micro-batches, attention other than vLLM's ``Attention`` named
``layers.N``) the engine wakes whole (logged once). On an H200 an 8B model's first token
after a switch came at 0.48 s instead of 0.51, bit-identical: the copy is the rest
(docs/design/switch-below-the-copy.md). Runs inside vLLM's worker process; imports vLLM's
GPU worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
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
    """The first step's waits, installed on vLLM's CUDA-graph dispatch and attention impls
    until the last attention layer has asked for the last copy. ``wait`` makes the current
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
        """``dispatcher``: the model runner's (vLLM's model runner V1 ``cudagraph_dispatcher``
        answers (mode, batch), V2's ``cudagraph_manager`` a batch with ``cg_mode``)."""
        dispatch = dispatcher.dispatch

        def dispatch_then_wait(*args: Any, **kwargs: Any) -> Any:
            chosen = dispatch(*args, **kwargs)
            mode = chosen[0] if isinstance(chosen, tuple) else chosen.cg_mode
            if mode == CUDAGraphMode.FULL:  # no Python runs between its layers: all first
                self._wait(self._events[-1])
                self.remove()
            else:  # the embedding and the first layer's projections
                self._wait(self._events[self._first])
            return chosen

        dispatcher.dispatch = dispatch_then_wait
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
        self._waits: StepWaits | None = None

    def sleep(self, level: int = 1) -> None:
        self._take_waits_down()  # woken, put away before any step: vLLM syncs first
        super().sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        backend = self.sleep_mode_backend
        if not isinstance(backend, ArenaBackend) or self._decoder is None:
            super().wake_up(tags)
            return
        backend.hold_weights = True
        try:
            super().wake_up(tags)
            backend.hold_weights = False
            if backend.held:
                self._copy_layer_by_layer(backend, *self._decoder)
        except BaseException:  # every weight whole before the error goes on
            backend.hold_weights = False
            self._take_waits_down()
            for address in list(backend.held):
                backend.map_and_copy(address, None)
            torch.cuda.synchronize()
            raise

    def _take_waits_down(self) -> None:
        if self._waits is not None:
            self._waits.remove()
            self._waits = None

    @cached_property
    def _decoder(self) -> tuple[dict[str, Any], wake_order.Layers] | None:
        """The attention layers by name and in order, or None (logged) where this engine
        wakes whole: the model's forward must be vLLM's decoder layers in order, each
        calling its attention impl's ``forward``, and nothing else must read a weight
        first. Known at the first wake (the model and its runner are built by then) and
        the same at every later one."""
        from vllm.model_executor.layers.attention.attention import Attention

        config = self.vllm_config
        context = config.compilation_config.static_forward_context
        attention = {name: layer for name, layer in context.items() if type(layer) is Attention}
        layers = wake_order.attention_layers(attention)
        why = None
        if config.speculative_config is not None:
            why = "a draft model's layers are not in the order"
        elif config.model_config.is_multimodal_model or config.model_config.is_encoder_decoder:
            why = "an encoder reads its weights outside the decoder's layers"
        elif config.model_config.quantization is not None:
            why = "a quantized model's scales and workspaces are not all named tensors"
        elif getattr(config.parallel_config, "use_ubatching", False):
            why = "micro-batches run the layers on two streams"
        elif len(attention) != len(context) or layers is None:
            why = "its layers are not all vLLM's Attention named layers.N"
        elif self._dispatcher() is None:
            why = "its model runner has no CUDA-graph dispatch this worker knows"
        if why is not None or layers is None:
            logger.info("vllm-offload layered wake: this engine wakes whole (%s)", why)
            return None
        return attention, layers

    def _dispatcher(self) -> Any:
        """The runner's CUDA-graph dispatch: model runner V1's dispatcher, V2's manager."""
        runner = self.model_runner
        found = getattr(runner, "cudagraph_dispatcher", None)
        return found if found is not None else getattr(runner, "cudagraph_manager", None)

    def _copy_layer_by_layer(
        self, backend: ArenaBackend, attention: dict[str, Any], layers: wake_order.Layers
    ) -> None:
        if self._order is None or set(backend.held) != set(chain(*self._order[0])):
            self._order = self._ordered(layers, list(backend.held.values()))
        groups, first, per_layer = self._order  # the same allocations each wake
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        events = []
        for group in groups:
            for address in group:
                backend.map_and_copy(address, stream.cuda_stream)
            events.append(torch.cuda.Event())  # type: ignore[no-untyped-call]
            events[-1].record(stream)
        self._waits = StepWaits(events, first, per_layer, _current_stream_waits)
        self._waits.install(self._dispatcher(), attention)

    def _ordered(
        self, layers: wake_order.Layers, held: list[Saved]
    ) -> tuple[list[tuple[int, ...]], int, dict[str, int]]:
        """The held allocations' addresses in copy groups, and the step's waits."""
        model = self.model_runner.model
        tensors = chain(model.named_parameters(), model.named_buffers())
        groups = wake_order.copy_groups(
            [(saved.ptr, saved.size) for saved in held],
            ((name, tensor.data_ptr()) for name, tensor in tensors),
            layers,
        )
        first, per_layer = wake_order.waits(groups, layers)
        addresses = [tuple(held[index].ptr for index in group.allocations) for group in groups]
        return addresses, first, per_layer


def _current_stream_waits(event: Any) -> None:
    torch.cuda.current_stream().wait_event(event)
