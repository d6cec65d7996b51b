"""Stateless callbacks handed to Lightning as one: its loop calls every callback at every hook, some 30
calls a step whether the callback has that hook or not (each in a profiler context), about 40 us a
callback a step on a 2-core CPU; :class:`Grouped` takes those calls once and passes each only to the
members that have the hook. Why: docs/performance.md, "The loop's host time per step"."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lightning.pytorch.callbacks import Callback, Checkpoint, EarlyStopping, ProgressBar, Timer
from lightning.pytorch.utilities.model_helpers import is_overridden

HOOKS = tuple(
    name
    for name, value in vars(Callback).items()
    if callable(value) and (name.startswith("on_") or name in ("setup", "teardown"))
)
"""Every hook Lightning calls on a callback (its ``Callback`` class defines each as a no-op)."""

KEPT_APART = (ProgressBar, Checkpoint, EarlyStopping, Timer)
"""Callbacks the Trainer looks up by type in its list (``trainer.progress_bar_callback``,
``checkpoint_callbacks``, ``early_stopping_callbacks``, its timer): never grouped."""

STATE = ("state_dict", "load_state_dict", "on_save_checkpoint", "on_load_checkpoint")
"""What a callback with a state of its own overrides: its state is saved under its own key, so it stays apart."""


def groupable(callback: Callback) -> bool:
    """Whether ``callback`` can join a group: no state of its own and nothing the Trainer looks up by type."""
    if isinstance(callback, KEPT_APART):
        return False
    return not any(is_overridden(name, callback, parent=Callback) for name in STATE)


class Grouped(Callback):
    """``members`` (each :func:`groupable`), in order, as one callback."""

    def __init__(self, members: Sequence[Callback]) -> None:
        self.members = tuple(members)
        self.by_hook = {
            hook: tuple(m for m in self.members if is_overridden(hook, m, parent=Callback)) for hook in HOOKS
        }


def _forwarder(hook: str) -> Callable[..., None]:
    def forward(self: Grouped, *args: object, **kwargs: object) -> None:
        for member in self.by_hook[hook]:
            getattr(member, hook)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = hook
    return forward


for _hook in HOOKS:
    setattr(Grouped, _hook, _forwarder(_hook))


def grouped(callbacks: Sequence[Callback]) -> list[Callback]:
    """``callbacks`` with the groupable ones as one :class:`Grouped`, where the first of them was;
    the others as they were, in order. Fewer than two groupable: unchanged."""
    joins = [groupable(c) for c in callbacks]
    members = [c for c, join in zip(callbacks, joins, strict=True) if join]
    if len(members) < 2:
        return list(callbacks)
    group = Grouped(members)
    return [
        group if c is members[0] else c for c, join in zip(callbacks, joins, strict=True) if c is members[0] or not join
    ]
