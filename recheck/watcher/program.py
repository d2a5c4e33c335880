"""``recheck run``: run a whole, unmodified Python program inside ``recheck.watch()``.

Two parts, both used by :mod:`recheck.commands.run_program`:

* :func:`run_program` runs ``SCRIPT.py`` or ``-m MODULE`` as ``python`` would (``runpy``, as
  ``python -m cProfile`` and ``coverage run`` do): ``sys.argv`` is the program's own,
  ``__name__`` is ``"__main__"``, ``sys.path[0]`` is the script's folder (the working
  directory for a module; ``__file__`` is the path as typed, as runpy sets it), and it returns
  the status ``python`` would exit with, printing an uncaught exception's traceback the way
  ``python`` prints it (without recheck's frames).
* :class:`ProgramWatch` is the ``watch()`` block around it, with step boundaries: a *step* is
  one outermost ``torch.optim.Optimizer.step()`` call (torch's global optimizer step hooks; an
  optimizer that steps an inner one, as ZeRO's does, is one step), or, in a
  program that never made an optimizer, one outermost ``torch.autograd.backward`` call.  With
  ``steps=N`` the block ends when the N-th step ends: the hook is removed, the patched
  checkpoint entry points are the originals again, and the rest of the program runs without
  recheck.  Anything that goes wrong inside recheck becomes a note; the program keeps running.
* :class:`StepTwin` (``--check-step``) finds the *step function*: the innermost function on
  the stack both at the first step's last outermost module forward and at its first backward
  (Trainer.training_step, Lightning's closure, a loop's ``train_step(model, batch)``).  A
  script is not a function, so a step cannot be replayed from an arbitrary line; a function
  can.  When the watched steps end, the next call of that function (the next step) is
  intercepted at its entry (``sys.setprofile``, until then only) and, before it runs, is
  compared with its uncheckpointed twin by :func:`recheck.checker.twin.check_step_report`
  with the arguments it was called with; the snapshot is put back and the call runs as the
  program made it.  When the next step's backward starts first (the step runs inline in a
  loop that is never called again) it says so and compares nothing.
"""

from __future__ import annotations

import functools
import inspect
import os
import runpy
import sys
import threading
import types
from typing import Any, Callable

from recheck.findings import Report, error_line

__all__ = ["BACKWARD", "OPTIMIZER_STEP", "ProgramWatch", "StepTwin", "run_program"]

#: What a step was: ``ProgramWatch.unit``.
OPTIMIZER_STEP = "optimizer step"
BACKWARD = "backward"
#: What the report's header says each unit is.
UNIT_MEANING = {
    OPTIMIZER_STEP: "a step is one torch.optim.Optimizer.step() call",
    BACKWARD: "no optimizer stepped: a step is one torch.autograd.backward call",
}


class ProgramWatch:
    """A ``watch()`` block from :meth:`start` until the ``steps``-th step ends, or :meth:`stop`.

    ``on_window_end(self)`` is called once, when the ``steps``-th step ends (not when
    :meth:`stop` ends the block early).  Nothing here raises into the program: a failure of
    recheck's own is kept in ``errors`` and stops the watching.
    """

    def __init__(self, steps: int | None, watch_options: dict[str, Any],
                 on_window_end: Callable[[ProgramWatch], None] | None = None,
                 check_step: Callable[..., Report] | None = None) -> None:
        self.steps = steps
        self.twin: StepTwin | None = StepTwin(watch_options, check_step) if check_step is not None else None
        self.watch_options = dict(watch_options)
        self.on_window_end = on_window_end
        self.optimizer_steps = 0
        self.backward_calls = 0
        self.errors: list[str] = []
        self.report: Report | None = None
        self.window_ended = False  # the steps-th step ended (as opposed to the program ending)
        self.started = False  # the watch block was entered
        self.place: Any = None  # the rank and world size the block saw (None for one process)
        self._watch: Any = None
        self._hooks: list[Any] = []
        self._stepping = threading.local()  # the optimizers whose step() is running, outermost first
        self._backward: Any = None  # the original torch.autograd.backward while ours is installed
        self._counting = False
        self._depth = threading.local()
        self._lock = threading.RLock()

    # -- what was watched -----------------------------------------------------------------

    @property
    def unit(self) -> str | None:
        """``OPTIMIZER_STEP`` once an optimizer stepped (or exists), ``BACKWARD`` when only backward ran."""
        if self.optimizer_steps or (self.backward_calls and _optimizer_exists()):
            return OPTIMIZER_STEP
        return BACKWARD if self.backward_calls else None

    @property
    def steps_watched(self) -> int:
        """How many steps ended while the block was active."""
        return self.optimizer_steps if self.unit == OPTIMIZER_STEP else self.backward_calls

    # -- the block ---------------------------------------------------------------------

    def start(self) -> None:
        """Enter the ``watch()`` block and install the step counters (failures become notes)."""
        from recheck.watcher.session import watch

        try:
            block = watch(raise_on_finding=False, **self.watch_options)
            block.__enter__()
        except Exception as exc:  # the program still runs, unwatched
            message = f"the watch block could not start ({error_line(exc)}); the program runs unwatched"
            _say(f"recheck run: {message}")
            self.report = Report(title="watch: not started")
            self._note(message)
            return
        self._watch = block
        self.started = self._counting = True
        try:
            import torch
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            self._hooks = [register_optimizer_step_pre_hook(self._before_optimizer_step),
                           register_optimizer_step_post_hook(self._after_optimizer_step)]
            self._backward = torch.autograd.backward
            torch.autograd.backward = self._counted_backward(self._backward)
            if self.twin is not None:
                self.twin.start(self._backward)
        except Exception as exc:  # an older or unusual torch: watch the whole program instead
            self._note(f"steps cannot be counted ({error_line(exc)}); the whole program is watched")

    def stop(self, exc: BaseException | None = None) -> Report | None:
        """End the block (once): hooks removed, interception undone, the report built."""
        with self._lock:
            if not self._counting and self._watch is None:
                return self.report
            self._counting = False
            self._uninstall()
            watcher, self._watch = self._watch, None
        if watcher is not None:
            try:
                watcher.__exit__(type(exc) if exc is not None else None, exc, None)
                self.place = watcher.place
                self.report = watcher.report
            except Exception as error:  # recheck's own failure: a note, never the program's
                self._note(f"the watch block failed to close ({type(error).__name__}: {error})")
                try:
                    self.report = watcher.report
                except Exception:
                    self.report = Report(title="watch: the report could not be built")
            for message in self.errors:
                self.report.notes.append(f"recheck run: {message}")
        return self.report

    def _uninstall(self) -> None:
        if self.twin is not None:
            self.twin.stop_looking()
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            try:
                hook.remove()
            except Exception as exc:
                self._note(f"an optimizer step hook could not be removed ({exc})")
        if self._backward is not None:
            original: Callable[..., Any] = self._backward
            self._backward = None
            try:
                import torch

                if getattr(torch.autograd.backward, "__wrapped__", None) is original:
                    torch.autograd.backward = original
                # else someone wrapped it after us: ours stays below theirs and passes calls through
            except Exception as exc:
                self._note(f"torch.autograd.backward could not be put back ({exc})")

    def _note(self, message: str) -> None:
        self.errors.append(message)
        if self.report is not None:  # the block already ended: the report says it too
            self.report.notes.append(f"recheck run: {message}")

    # -- step boundaries ---------------------------------------------------------------

    def _counted_backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        depth = self._depth

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if not self._counting or getattr(depth, "value", 0) != 0:  # not watching, or a nested call
                return original(*args, **kwargs)  # (a reentrant checkpoint's backward calls it)
            depth.value = 1
            if self.twin is not None:
                self.twin.backward_began()
            try:
                result = original(*args, **kwargs)
            finally:
                depth.value = 0
            self._step_ended(backward=True)
            return result

        return backward

    def _running(self) -> list[Any]:
        running = getattr(self._stepping, "optimizers", None)
        if running is None:
            running = self._stepping.optimizers = []
        return running

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            running = self._running()
            if any(o is optimizer for o in running):  # left there by a step() that raised
                del running[next(i for i, o in enumerate(running) if o is optimizer):]
            running.append(optimizer)
            if self.twin is not None and not any(o is optimizer for o in self.twin.optimizers):
                self.twin.optimizers.append(optimizer)
        except Exception as exc:  # never raised into the program's optimizer step
            self._note(f"an optimizer step was not followed ({error_line(exc)})")

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """One step per outermost ``step()``: an optimizer that steps an inner one (ZeRO) is one step."""
        try:
            running = self._running()
            for i in range(len(running) - 1, -1, -1):
                if running[i] is optimizer:
                    del running[i:]
                    break
        except Exception as exc:  # never raised into the program's optimizer step
            self._note(f"an optimizer step was not followed ({error_line(exc)})")
            return
        if not running:
            self._step_ended(backward=False)

    def _step_ended(self, *, backward: bool) -> None:
        try:
            with self._lock:
                if not self._counting:
                    return
                if backward:
                    self.backward_calls += 1
                    if self.optimizer_steps or _optimizer_exists():
                        return  # the optimizer's steps are the steps
                    done = self.steps is not None and self.backward_calls >= self.steps
                else:
                    self.optimizer_steps += 1
                    done = self.steps is not None and self.optimizer_steps >= self.steps
                if not done:
                    return
                self.window_ended = True
            self.stop()
            if self.on_window_end is not None:
                self.on_window_end(self)
            if self.twin is not None:
                self.twin.arm()
        except Exception as exc:  # never raised into the program's training step
            self._note(f"watching stopped after an internal error ({error_line(exc)})")
            _say(f"recheck run: internal error, watching stopped: {error_line(exc)}")
            try:
                self.stop()
            except Exception:
                pass


class StepTwin:
    """``--check-step``: the program's step function, found in its first step and compared with its
    uncheckpointed twin at its first call after the watched steps (see the module's docstring).

    ``report`` is the twin's report once it ran; ``reason`` says why no twin ran.  Nothing raises
    into the program: a twin that fails is a reason.
    """

    def __init__(self, watch_options: dict[str, Any], check_step: Callable[..., Report]) -> None:
        self.watch_options = watch_options
        self.check_step = check_step  # check_step_report (the checker is above the watcher: passed in)
        self.report: Report | None = None
        self.reason: str | None = "the program made no step after the watched ones"
        self.step_function: str | None = None  # its qualified name and place, once found
        self.optimizers: list[Any] = []  # those the watched steps stepped: their state is the step's
        self.modules: list[Any] = []  # the outermost modules the first step ran
        self._code: Any = None  # the step function's code
        self._forward: list[Any] = []  # the frames around the last outermost module forward
        self._backward_code: Any = None
        self._call_impl: Any = None
        self._hook: Any = None
        self._looking = False

    def start(self, backward: Callable[..., Any]) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook

        self._backward_code = getattr(backward, "__code__", None)
        self._call_impl = _call_impl_file()
        self._hook = register_module_forward_pre_hook(self._forward_began)
        self._looking = True

    def stop_looking(self) -> None:
        hook, self._hook, self._forward, self._looking = self._hook, None, [], False
        if hook is not None:
            hook.remove()

    def _forward_began(self, module: Any, args: Any) -> None:
        frames = _program_frames(sys._getframe(1))
        calls = sum(1 for f in frames if f.f_code.co_name == "_call_impl" and f.f_code.co_filename == self._call_impl)
        if calls == 1:  # the outermost module call
            self._forward = frames
            if not any(m is module for m in self.modules):
                self.modules.append(module)

    def backward_began(self) -> None:
        """The first step's backward: the step function is the innermost function around both."""
        if not self._looking:
            return
        forward = {id(f) for f in self._forward}  # held until now: their ids are theirs
        frames = _program_frames(sys._getframe(1))
        self.stop_looking()
        common = [f for f in frames if id(f) in forward]
        if not common:
            self.reason = "the first step's forward was not found (no module call before its backward)"
            return
        inner = common[0]
        self._code = inner.f_code
        top = inner.f_code.co_name == "<module>"
        self.step_function = (f"the top level of {_place(inner.f_code)}" if top
                              else f"{inner.f_code.co_qualname} ({_place(inner.f_code)})")
        self.reason = (f"its forward and backward run in {self.step_function}, which the program did "
                       "not call again before the next step's backward (a loop body is not a function "
                       "recheck can call again: move the step into a function the loop calls, or use "
                       "recheck check --step)")

    def arm(self) -> None:
        """Wait for the step function's next call (profiling calls until then)."""
        if self._code is None:
            return
        if self._code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR):
            self.reason = f"the step function {self.step_function} is a generator or coroutine"
            return
        if sys.getprofile() is not None:  # a profiler of the program's own: never replaced
            self.reason = "the program runs under a profiler (sys.setprofile), which the step's interception would replace"
            return
        sys.setprofile(self._profile)

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or (frame.f_code is not self._code and frame.f_code is not self._backward_code):
            return
        sys.setprofile(None)
        if frame.f_code is self._code:
            try:
                self._compare(frame)
            except Exception as exc:  # the program's call still runs as it was made
                self.report = None
                self.reason = f"the twin of {self.step_function} could not run ({error_line(exc)})"

    def _compare(self, frame: Any) -> None:
        """Compare the call ``frame`` is about to make with its twin, from the arguments it was given."""
        import gc

        code, values = frame.f_code, frame.f_locals
        free = [values.get(name) for name in code.co_freevars]
        functions = [f for f in gc.get_referrers(code) if isinstance(f, types.FunctionType) and f.__code__ is code
                     and all(c.cell_contents is v for c, v in zip(f.__closure__ or (), free))]
        if not functions:
            self.reason = f"the function object of {self.step_function} could not be found"
            return
        names = code.co_varnames
        positional = [values[n] for n in names[:code.co_argcount]]
        at = code.co_argcount + code.co_kwonlyargcount
        keywords = {n: values[n] for n in names[code.co_argcount:at]}
        if code.co_flags & inspect.CO_VARARGS:
            positional += list(values[names[at]])
            at += 1
        if code.co_flags & inspect.CO_VARKEYWORDS:
            keywords.update(values[names[at]])
        step = functools.partial(functions[0], *positional, **keywords)
        self.report = self.check_step(step, watch_options=self.watch_options, modules=self.modules,
                                        optimizers=self.optimizers)
        self.reason = None


def _program_frames(frame: Any) -> list[Any]:
    """``frame`` and its callers, innermost first, without recheck's and runpy's frames."""
    frames = []
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_INTERNAL) or name == runpy.__file__ or name.startswith("<frozen runpy")):
            frames.append(frame)
        frame = frame.f_back
    return frames


def _place(code: Any) -> str:
    name = os.path.basename(code.co_filename)
    return name if code.co_name == "<module>" else f"{name}:{code.co_firstlineno}"


def _optimizer_exists() -> bool:
    """Whether a ``torch.optim.Optimizer`` was made in this process.

    Read without patching anything: the first optimizer of a class wraps its class's ``step``
    and marks it ``hooked`` (``Optimizer._patch_step_function``).
    """
    torch = sys.modules.get("torch")
    base = getattr(getattr(torch, "optim", None), "Optimizer", None)
    if base is None:
        return False
    stack, seen = [base], set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if getattr(cls.__dict__.get("step"), "hooked", False):
            return True
        stack.extend(cls.__subclasses__())
    return False


_INTERNAL = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the recheck package


def _call_impl_file() -> str:
    """Where ``nn.Module._call_impl`` is (by name: watch() may have wrapped the method itself)."""
    import torch.nn.modules.module

    return torch.nn.modules.module.__file__


def _say(text: str) -> None:
    """A line of recheck's on stderr, after what the program has printed so far."""
    try:
        sys.stdout.flush()
    except Exception:
        pass
    print(text, file=sys.stderr, flush=True)


# -- running the program as python would ------------------------------------------------------------


def run_program(target: str, args: list[str], *, module: bool = False,
                before: Callable[[], None] | None = None,
                after: Callable[[BaseException | None], object] | None = None) -> int:
    """Run ``target`` (a script path, or a module name with ``module=True``) as ``python`` would.

    ``before()`` is called just before the program's first line, ``after(exc)`` right after its
    last (``exc`` the exception that ended it, None when it returned); the traceback of an
    uncaught exception is printed after ``after``.  Returns the exit status ``python`` would
    have had: 0, ``sys.exit``'s code, 1 for an uncaught exception, 130 for Ctrl-C.
    ``sys.argv`` and ``sys.path[0]`` are put back when it returns.
    """
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [target, *args]  # runpy puts the script's or module's file in argv[0] as python does
    folder = os.getcwd() if module else os.path.dirname(os.path.realpath(target))
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)
    ended: BaseException | None = None
    try:
        if before is not None:
            before()
        try:
            if module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
        except BaseException as exc:
            ended = exc
        if after is not None:
            after(ended)
        return _status(ended)
    finally:
        sys.argv[:] = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _status(exc: BaseException | None) -> int:
    """The exit status of a program that ended with ``exc``; an uncaught exception's traceback is printed."""
    if exc is None:
        return 0
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):  # bool too: sys.exit(True) is 1
            return int(code) & 0xFF
        _say(str(code))  # python prints a non-integer code and exits with 1
        return 1
    try:
        sys.stdout.flush()
    except Exception:
        pass
    trimmed = _user_frames(exc.__traceback__)
    exc.with_traceback(trimmed)  # the default hook prints the exception's own __traceback__
    sys.excepthook(type(exc), exc, trimmed)
    sys.stderr.flush()
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _user_frames(tb: Any) -> Any:
    """The traceback from the program's first frame on: runpy's and recheck's are dropped."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the recheck package
    internal = (os.path.abspath(runpy.__file__),)
    while tb is not None:
        raw = tb.tb_frame.f_code.co_filename
        name = os.path.abspath(raw)
        if not (name.startswith(here + os.sep) or name in internal or raw.startswith("<frozen runpy")):
            break
        tb = tb.tb_next
    return tb
