"""Errors raised by dynamo-relational. Each names the option, node or shape at fault."""


class RelationalError(RuntimeError):
    """Base class of every error this package raises on purpose."""


class OptionsError(RelationalError, ValueError):
    """An option given to the backend is unknown or has a bad value."""


class FrontendError(RelationalError):
    """The fast front-end cannot trace or run a model; the message names the source line or argument."""


class DataDependenceError(FrontendError):
    """Traced code read a tensor's values (``t.tolist()``, ``if t > 0``); ``inputs`` names the inputs that the
    value read was computed from."""

    def __init__(self, line: str, what: str, inputs: tuple[str, ...] = (), stack: str = ""):
        super().__init__(
            f"data-dependent control flow at {line}\n{what}.\n"
            "dynamo_relational.compile traces the structure from Python data only: it cannot branch on, or "
            "read, tensor values. Use tensor ops (torch.where, masks as multiplications), or "
            "torch.compile(model, backend=\"relational\") which handles graph breaks."
            + (f"\nUser stack (innermost last):\n{stack}" if stack else ""))
        self.inputs = inputs


class GradStateRead(FrontendError):
    """Traced code read a tensor's ``requires_grad``, which the tracer, computing values without gradients,
    cannot answer (a call recorded with gradients on can)."""


class UntracedCall(FrontendError):
    """A live trace's call ran, but what it did could not be traced (library code that the recording gave up
    on and that fails on the tracer's proxies); ``result`` is the call's result, in a 1-tuple."""

    def __init__(self, message: str, result: tuple):
        super().__init__(message)
        self.result = result


class StoredTracedValue(FrontendError):
    """A live trace's call stored a traced value in the model (an attribute, a list it holds), which a graph
    cannot repeat for each sample; the store, the call's writes and its random draws are undone."""
