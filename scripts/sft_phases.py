"""A step of each SFT trainer in pieces, for scripts/profile_sft.py: sft's as run/sft.py's sft_step
runs it, mlx_lm.lora's as mlx_lm.tuner.trainer.train builds it, each phase timed on its own (the
batch, the forward, the forward and backward, the optimizer's update).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, also when loaded by path
from benchlib import Timer  # noqa: E402

MEASURED = ("batch", "forward", "forward_backward", "optimizer", "step")


def timed_steps(count: int, build, forward, forward_backward, optimizer_update) -> dict:
    """Seconds of each phase at each step 1..count: every phase evaluates what it makes before its clock
    stops."""
    import mlx.core as mx

    times = {name: [] for name in MEASURED if name != "step"}

    def clock(name, fn, *args):
        mx.synchronize()
        with Timer() as timer:
            out = fn(*args)
            mx.synchronize()
        times[name].append(timer.seconds)
        return out

    for step in range(1, count + 1):
        batch = clock("batch", build, step)
        clock("forward", forward, batch)
        grads = clock("forward_backward", forward_backward, batch)
        clock("optimizer", optimizer_update, grads)
    return times


def sft_phases(run, count: int) -> tuple[dict, list]:
    """sft's step in pieces, as run/sft.py's sft_step runs them: (seconds per phase, micro-batch shapes)."""
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx.utils import tree_map

    from mlx_grpo.device import on_cpu
    from mlx_grpo.run.sft import batch_indices, head_chunk, micro_batches, pad_id_of, trained_count
    from mlx_grpo.update import gradients
    from mlx_grpo.update.sft_loss import pad_rows, sft_gradients, sft_loss

    config, model, optimizer, pad = run.config, run.model, run.optimizer, pad_id_of(run.tokenizer)
    chunk = config.logprob_chunk_size
    compiled = (
        gradients.COMPILE_ON_CPU and on_cpu() and not gradients._dropout_active(model)
    )  # as sft_gradients
    shapes = []

    def build(step):
        examples = [run.train[i] for i in batch_indices(len(run.train), config.batch_size, step, config.seed)]
        parts = [pad_rows(part, pad) for part in micro_batches(examples, config.micro_batch_size)]
        mx.eval(parts)
        shapes[:] = [list(tokens.shape) for tokens, _ in parts]
        return parts, max(trained_count(examples), 1)

    def forward(batch):
        parts, count = batch
        for tokens, trained in parts:

            def loss(
                tokens=tokens, trained=trained
            ):  # no gradient: the plain forward, as validation_loss runs it
                size = head_chunk(model, tokens, chunk)
                return sft_loss(model, tokens, trained, count, size, differentiated=False), {}

            gradients._evaluated(model, loss, compiled)[0].item()

    def forward_backward(batch):
        parts, count = batch
        grads = None
        for tokens, trained in parts:
            loss, g = sft_gradients(model, tokens, trained, count, head_chunk(model, tokens, chunk))
            grads = g if grads is None else tree_map(mx.add, grads, g)
            mx.eval(grads, loss)
            loss.item()
        return grads

    def optimizer_update(grads):
        grads, norm = optim.clip_grad_norm(grads, config.max_grad_norm)
        norm.item()
        optimizer.update(model, grads)
        mx.eval(model.trainable_parameters(), optimizer.state)

    return timed_steps(count, build, forward, forward_backward, optimizer_update), shapes


def peer_phases(model, optimizer, dataset, training_args, count: int) -> tuple[dict, list]:
    """mlx_lm.lora's step in pieces, built as mlx_lm.tuner.trainer.train builds it: (seconds, batch
    shapes)."""
    from functools import partial

    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tuner.trainer import default_loss, iterate_batches

    batches = iterate_batches(
        dataset=dataset,
        batch_size=training_args.batch_size,
        max_seq_length=training_args.max_seq_length,
        loop=True,
        comm_group=mx.distributed.init(),
    )
    state = [model.state, optimizer.state, mx.random.state]
    loss_value_and_grad = nn.value_and_grad(model, default_loss)
    shapes = []

    @partial(mx.compile, inputs=state, outputs=state)
    def loss_only(batch, lengths):
        return default_loss(model, batch, lengths)

    @partial(mx.compile, inputs=state, outputs=state)
    def value_and_grad(batch, lengths):
        (loss, tokens), grad = loss_value_and_grad(model, batch, lengths)
        return loss, tokens, grad

    @partial(mx.compile, inputs=state, outputs=state)
    def update(grad):
        optimizer.update(model, grad)

    def build(step):
        batch = next(batches)
        mx.eval(batch)
        shapes[:] = [list(batch[0].shape)]
        return batch

    def forward(batch):
        mx.eval(loss_only(*batch))

    def forward_backward(batch):
        out = value_and_grad(*batch)
        mx.eval(out)
        return out[2]

    def optimizer_update(grad):
        update(grad)
        mx.eval(state)

    return timed_steps(count, build, forward, forward_backward, optimizer_update), shapes
