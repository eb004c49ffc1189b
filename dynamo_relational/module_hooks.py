"""Module hooks and the fast front-end: forward hooks and pre-hooks run while tracing, as in eager, so the
hooks registered are part of what a traced graph depends on (:func:`module_hooks`, :func:`global_hooks`);
hooks that tracing cannot record are refused (:func:`refuse_unrecorded_hooks`)."""
from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _nn_module

from .errors import FrontendError


def module_hooks(module: nn.Module) -> tuple[dict, ...]:
    """The hooks that run when ``module`` is called, by kind (handle id -> hook)."""
    return module._forward_pre_hooks, module._forward_hooks, module._backward_pre_hooks, module._backward_hooks


def global_hooks() -> tuple[dict, ...]:
    """The hooks registered for every module (``nn.modules.module.register_module_forward_hook`` etc.)."""
    return (_nn_module._global_forward_pre_hooks, _nn_module._global_forward_hooks,
            _nn_module._global_backward_pre_hooks, _nn_module._global_backward_hooks)


def refuse_unrecorded_hooks(model: nn.Module) -> None:
    """Hooks that tracing cannot record, refused rather than dropped or doubled: module backward hooks
    (``register_full_backward_hook``) wrap a call's tensors in an autograd Function, which skips
    proxies; global module hooks (``nn.modules.module.register_module_forward_hook`` and the like)
    would also run on the modules that the compiled module calls, itself included."""
    if any(global_hooks()):
        raise FrontendError(f"{type(model).__name__}: global module hooks (torch.nn.modules.module."
                            "register_module_*_hook) are not supported by dynamo_relational.compile: they would "
                            "also run on the modules it calls. Register the hook on the model's own modules.")
    hooked = [f"{name or 'the model'} ({type(m).__name__})" for name, m in model.named_modules()
              if m._backward_hooks or m._backward_pre_hooks]
    if hooked:
        raise FrontendError(f"{type(model).__name__}: module backward hooks are not recorded by "
                            f"dynamo_relational.compile, on {', '.join(hooked)}. Remove them, or use "
                            "torch.compile(model, backend=\"relational\"), which runs them.")
