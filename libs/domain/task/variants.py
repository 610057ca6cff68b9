"""Task variants (docs/scheduling.md#variants): the spec one variant runs, and which one a
placed task runs.

A task with `variants` names its cards only in them; the scheduler places the first one it
can (services/scheduler/placement/variants.py) and records its index on the task
(`Task.variant`). Everything that acts on the placement (the run spec the agent gets, the
quota and card accounting) reads `placed_spec`, so it sees the placed variant's cards,
image, command and environment.
"""

from __future__ import annotations

from libs.domain.task.model import Task, TaskSpec, TaskVariant, boosted


def variant_spec(spec: TaskSpec, index: int) -> TaskSpec:
    """`spec` as variant `index` runs it: the variant's cards; its image and command where
    it names one, else the task's; its env laid over the task's. The result has no variants
    (it is what runs) and gets the inference memory boost of its own image."""
    var = spec.variants[index]
    update = {
        "gpu_type": var.gpu_type,
        "gpu_required": var.gpu_required,
        "gpu_memory_mb": var.gpu_memory_mb,
        "gpu_compute_ratio": var.gpu_compute_ratio,
        "image": var.image or spec.image,
        "command": var.command or spec.command,
        "env": dict(spec.env) | dict(var.env),
        "variants": (),
    }
    return boosted(spec.model_copy(update=update))


def placed_spec(task: Task) -> TaskSpec:
    """The spec the task runs: its placed variant's (`variant_spec`), else its own."""
    index = task.variant
    if index is None or not 0 <= index < len(task.spec.variants):
        return task.spec
    return variant_spec(task.spec, index)


def variant_label(var: TaskVariant) -> str:
    """How a reason names a variant's cards: its gpu_type, "any GPU" or "CPU only"."""
    if var.gpu_type:
        return var.gpu_type
    return "any GPU" if var.gpu_required or var.is_fractional else "CPU only"
