"""The user's source lines while tracing: the frames of user code (not of torch or of the tracer itself) that
errors name and that each node records as its ``stack_trace`` (the grouping's code-site hint).

Frames are classified once per code object and formatted once per line."""
from __future__ import annotations

import linecache
import os
import re
import sys
import traceback
from types import CodeType, FrameType

import torch
import torch.fx as fx

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: this package's modules on the stack between the tracer's ``trace`` call and user code, or under it
_TRACING_MODULES = ("tracer", "recorder", "value_proxy", "untraced_calls", "tracing_patches", "data_dependence",
                    "source_lines")
#: frames of the tracing machinery itself, never shown as user code
_INTERNAL = (os.path.join(_TORCH_DIR, "fx") + os.sep, os.path.join(_TORCH_DIR, "overrides.py"),
             os.path.join(_TORCH_DIR, "_tensor.py"),
             os.path.join(_TORCH_DIR, "nn", "modules", "module.py"),
             *(os.path.join(_PACKAGE_DIR, f"{name}.py") for name in _TRACING_MODULES))

#: a user frame: its code object and line number
Frame = tuple[CodeType, int]

#: what a frame's code is: user code, torch's own Python code (a module's ``forward``, a functional: named
#: beside the user's line that called it), or the tracing machinery (never named)
_USER, _TORCH, _MACHINERY = 0, 1, 2
_kinds: dict[CodeType, int] = {}


def _kind(code: CodeType) -> int:
    kind = _kinds.get(code)
    if kind is None:
        name = code.co_filename
        kind = _kinds[code] = _MACHINERY if name.startswith(_INTERNAL) else \
            _TORCH if name.startswith(_TORCH_DIR) else _USER
    return kind


def _is_internal(code: CodeType) -> bool:
    return _kind(code) == _MACHINERY


def frames(stop: FrameType | None) -> list[Frame]:
    """(code, line) of the user frames between the tracer's ``trace`` call (``stop``) and here, innermost first."""
    out = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame is not stop:
        if not _is_internal(frame.f_code):
            out.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return out


def code_site(stop: FrameType | None, skip: int = 0) -> tuple[Frame, ...]:
    """The innermost user frame between ``stop`` and the caller, whose ``skip`` innermost frames are known to be
    internal (not walked: Python makes a frame object for each frame walked), and where that frame is torch's
    own Python code (a module's ``forward``, a functional), first the innermost frame outside torch: the
    user's line that called it. Outermost first, as Dynamo's ``stack_trace`` lists frames."""
    frame: FrameType | None = sys._getframe(1 + skip)
    known = _kinds.get   # (inlined :func:`_kind`: the tracer walks these frames for every op)
    inner: Frame | None = None
    while frame is not None and frame is not stop:
        code = frame.f_code
        kind = known(code)
        if kind is None:
            kind = _kind(code)
        if kind == _USER:
            return ((code, frame.f_lineno),) if inner is None else ((code, frame.f_lineno), inner)
        if kind == _TORCH and inner is None:
            inner = code, frame.f_lineno
        frame = frame.f_back
    return (inner,) if inner is not None else ()


def traceback_frames(error: BaseException) -> list[Frame]:
    """(code, line) of the user frames an exception passed through, innermost first."""
    passed = [(frame.f_code, line) for frame, line in traceback.walk_tb(error.__traceback__)]
    return [f for f in reversed(passed) if not _is_internal(f[0])]


def format_frame(code: CodeType, line: int) -> str:
    text = linecache.getline(code.co_filename, line).strip()
    return f'  File "{code.co_filename}", line {line}, in {code.co_name}\n    {text}\n'


_formatted: dict[tuple[Frame, ...], str] = {}


def formatted_site(site: tuple[Frame, ...]) -> str:
    """``site``'s frames in Dynamo's ``stack_trace`` format (the grouping's code-site hint reads the innermost,
    messages the outermost); "" for none."""
    text = _formatted.get(site)
    if text is None:
        if len(_formatted) > 65536:   # (a bound for code made anew at run time)
            _formatted.clear()
        text = _formatted[site] = "".join(format_frame(*frame) for frame in site)
    return text


def user_line(user_frames: list[Frame]) -> str:
    """``file:line: code`` of the innermost frame outside torch (the user's line)."""
    user = [f for f in user_frames if _kind(f[0]) == _USER] or list(user_frames)
    if not user:
        return "<unknown source line>"
    code, line = user[0]
    return f"{code.co_filename}:{line} in {code.co_name}: {linecache.getline(code.co_filename, line).strip()}"


def recorded_line(node: fx.Node) -> str:
    """``file:line in function: code`` where ``node`` was recorded (its ``stack_trace``)."""
    match = re.search(r'File "(.+)", line (\d+), in (\S+)\n\s*(.*)', node.meta.get("stack_trace") or "")
    return f"{match[1]}:{match[2]} in {match[3]}: {match[4]}" if match else "an unknown source line"
