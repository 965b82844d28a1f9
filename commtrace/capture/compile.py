"""Out of torch.compile's way: Dynamo sees torch's functions, never commtrace's wrappers.

Under ``torch.compile`` Dynamo does not run Python: it reads the bytecode of every function the
compiled code calls and turns it into a graph. Left alone, it would read a wrapper's own code:
its clock reads and C calls make ``fullgraph=True`` fail and add graph breaks otherwise, and its
reads of commtrace's changing state become guards that fail (``KeyError`` on ``_by_key``,
recompilations). The decision (docs/faq.md, "torch.compile"):

- Every wrapper carries ``_torchdynamo_inline = <torch's function>``, the attribute by which
  Dynamo's own wrappers (``torch._dynamo.optimize``, ``torch.jit.script``) tell Dynamo "trace
  this instead". Dynamo honours it for Python functions, including methods on a class
  (``Work.wait``, ``DistributedDataParallel.forward``).
- The C fast-path objects are not Python functions, so Dynamo would not look at the attribute:
  each wrapper is also registered in Dynamo's table of objects it builds by identity
  (``VariableBuilder._id_dispatch()``, the table ``torch.compiler.substitute_in_graph`` fills),
  mapping it to the variable Dynamo builds for a Python function with that attribute. That
  variable stands for the wrapper (``P2POp`` checks ``op is isend`` by identity, and a graph
  break hands the wrapper, not torch's function, back to eager code) and traces torch's function
  when called. The guards are on the wrapper's identity and on that attribute, both fixed for
  the life of the process; never on the recorder.
- Dynamo rewrites in-place c10d collectives (``dist.all_reduce(t)``) to functional ones through
  ``_functional_collectives.traceable_collective_remaps``, keyed by the c10d function objects
  that existed when that module was imported. When the wrappers were in place by then, the keys
  are wrappers; torch's originals are added as keys too (same values), so the rewrite applies to
  what Dynamo now sees.

- Commtrace's capture package is a Dynamo skip directory (``torch._dynamo.trace_rules.add``):
  a wrapper called eagerly while a compiled function runs (at a graph break) is not compiled
  as a frame of its own. Dynamo would otherwise rewrite the collective inside it (an
  ``isend`` returning a tensor instead of a ``Work``) and guard on commtrace's state.

So a compiled graph holds exactly what it would hold without commtrace, and nothing in it is
recorded: collectives inside compiled graphs run as ``torch.ops._c10d_functional`` kernels that
no Python wrapper sees. Calls that run eagerly (outside compiled code, or at a graph break)
are recorded as usual.

The hooks into Dynamo are applied when ``torch._dynamo`` and
``torch.distributed._functional_collectives`` are imported (an import hook, as for
``distributed_c10d``), or at once when they already are; commtrace never imports Dynamo itself
(about 800 modules). Each step is guarded: on a torch without these internals the wrappers
still work and compile behaves as it did before.
"""

from __future__ import annotations

import sys
import threading

from . import importhook, log
from .registry import ORIGINAL_ATTR

INLINE_ATTR = "_torchdynamo_inline"
BUILDER = "torch._dynamo.variables.builder"
#: The package whose import completes Dynamo's: its table can be read then (reading it while
#: the builder module itself is being imported fails on a circular import).
DYNAMO = "torch._dynamo"
FUNCOL = "torch.distributed._functional_collectives"

_lock = threading.RLock()
#: id -> wrapper, for every wrapper marked; the strong reference keeps the id from being reused
#: by another object while Dynamo's table maps it.
_wrappers: dict[int, object] = {}
_dispatch_map = None   # Dynamo's id -> builder table, once Dynamo is imported


def mark(wrapper, orig=None, owner=None):
    """Tell Dynamo to trace `orig` (default: the wrapper's recorded original) wherever it meets
    `wrapper`, installed as an attribute of `owner`. Never raises; returns `wrapper`."""
    import types

    if type(wrapper).__name__ == "instancemethod":
        # A C++-style method (Work.wait): Dynamo handles it as it handles torch's own.
        return wrapper
    try:
        if orig is None:
            orig = getattr(wrapper, ORIGINAL_ATTR)
        if isinstance(owner, type) and not isinstance(orig, types.FunctionType):
            # A method of a C++ class (the host-read methods of torch.Tensor patched while an
            # async op is pending): Dynamo handles tensors' methods itself and, would it look
            # at this one, would find a function in a skipped directory (a graph break)
            # rather than trace commtrace's code; "inline a C method" has no meaning to it.
            return wrapper
        if not _python_rewrite_key(wrapper):
            setattr(wrapper, INLINE_ATTR, orig)
    except Exception as e:
        log.warn_once("compile-mark", "cannot mark a wrapper for torch.compile", e)
        return wrapper
    with _lock:
        _wrappers[id(wrapper)] = wrapper
        if _dispatch_map is not None:
            _register(wrapper)
    return wrapper


def _remaps():
    mod = sys.modules.get(FUNCOL)
    if mod is None or _initialising(mod):
        return None
    return getattr(mod, "traceable_collective_remaps", None)


def _python_rewrite_key(wrapper, remaps=None) -> bool:
    """A Python-function wrapper of a c10d function Dynamo rewrites. Dynamo builds its rewrite
    variable for the wrapper itself (its checks compare the function with
    ``torch.distributed.<name>``, the wrapper), so the wrapper must not send Dynamo to torch's
    function through ``_torchdynamo_inline`` (Dynamo re-reads that attribute whenever it copies
    the variable)."""
    import types

    if remaps is None:
        remaps = _remaps()
    if remaps is None or not isinstance(wrapper, types.FunctionType):
        return False
    orig = getattr(wrapper, ORIGINAL_ATTR, None)
    try:
        return wrapper in remaps or (orig is not None and orig in remaps)
    except TypeError:
        return False


def unmark(wrapper) -> None:
    """Forget `wrapper` (uninstall): Dynamo's table no longer maps its id."""
    with _lock:
        if _wrappers.pop(id(wrapper), None) is not None and _dispatch_map is not None:
            _dispatch_map.pop(id(wrapper), None)


def _build_wrapper(builder, value):
    """Dynamo's variable for a wrapper met by identity (a module attribute, a global).

    - A c10d function Dynamo rewrites (a key of ``traceable_collective_remaps``): the rewrite
      variable Dynamo builds for torch's function, so the graph holds the same functional
      collective. Dynamo's rewrite compares the function with ``torch.distributed.<name>`` (to
      convert ``op=ReduceOp.X``, to refuse P2P when disabled), which is the wrapper: a Python
      wrapper is the variable's function itself; a C wrapper compares equal to torch's function
      (``_fastpath.c``, ``ctx_richcompare``).
    - Anything else: the variable Dynamo builds for a Python function carrying
      ``_torchdynamo_inline``. It stands for the wrapper (identity comparisons such as
      ``P2POp``'s, and the value a graph break hands back to eager code, are the wrapper's) and,
      when called, traces torch's function read through ``__commtrace_original__``.
    """
    import types

    from torch._dynamo.guards import GuardBuilder

    builder.install_guards(GuardBuilder.ID_MATCH)
    orig = getattr(value, ORIGINAL_ATTR)
    remaps = _remaps()
    if remaps is not None and (orig in remaps or value in remaps):
        from torch._dynamo.variables.functions import CollectiveFunctionRewriteVariable

        fn = value if isinstance(value, types.FunctionType) else orig
        remaps.setdefault(fn, remaps.get(orig, remaps.get(value)))
        return CollectiveFunctionRewriteVariable.create(builder.tx, fn, source=builder.source)
    from torch._dynamo.variables.base import AttributeMutationExisting
    from torch._dynamo.variables.functions import WrapperUserFunctionVariable

    return WrapperUserFunctionVariable(value, ORIGINAL_ATTR, source=builder.source,
                                       mutation_type=AttributeMutationExisting())


def _register(wrapper) -> None:
    _dispatch_map[id(wrapper)] = _build_wrapper


def _on_dynamo(_module) -> None:
    """Dynamo is imported: register every wrapper marked so far."""
    global _dispatch_map
    try:
        table = sys.modules[BUILDER].VariableBuilder._id_dispatch()
        if not isinstance(table, dict):
            raise TypeError(f"unexpected id dispatch table {type(table).__name__}")
    except Exception as e:
        log.warn_once("compile-builder", "torch.compile may trace commtrace's C wrappers", e)
        return
    with _lock:
        _dispatch_map = table
        for w in _wrappers.values():
            _register(w)
    _wait_as_instancemethod()
    try:
        # Frames of commtrace's own code that run while a compiled function runs (a wrapper
        # called eagerly at a graph break) are not compiled themselves: Dynamo would trace
        # the wrapper's body as a frame of its own, rewrite torch's call inside it and guard on
        # commtrace's state.
        rules = sys.modules["torch._dynamo.trace_rules"]
        if not getattr(rules, "_commtrace_skipped", False):
            rules.add(__package__)
            rules._commtrace_skipped = True
    except Exception as e:
        log.warn_once("compile-skip", "torch.compile may compile commtrace's frames", e)


def _wait_as_instancemethod() -> None:
    """Install the ``Work.wait`` wrapper as an ``instancemethod``, the kind of object torch's own
    ``Work.wait`` is: Dynamo then treats both alike (a C object of another type would be
    fetched unbound from the class and called without its ``self``)."""
    try:
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        Work = getattr(c10d, "Work", None)
        cur = Work.__dict__.get("wait") if Work is not None else None
        if cur is None or type(cur).__name__ == "instancemethod" \
                or not hasattr(cur, ORIGINAL_ATTR):
            return
        from . import registry, wrappers

        registry.swap(Work, "wait", wrappers.instancemethod(cur))
    except Exception as e:
        log.warn_once("compile-wait", "torch.compile may trace commtrace's Work.wait", e)


def _on_funcol(module) -> None:
    """Key Dynamo's in-place collective rewrites by torch's originals as well as the wrappers,
    and take ``_torchdynamo_inline`` off the Python wrappers Dynamo rewrites."""
    try:
        remaps = module.traceable_collective_remaps
        for k, v in list(remaps.items()):
            orig = getattr(k, ORIGINAL_ATTR, None)
            while orig is not None:
                remaps.setdefault(orig, v)
                orig = getattr(orig, ORIGINAL_ATTR, None)
        with _lock:
            for w in list(_wrappers.values()):
                if _python_rewrite_key(w, remaps):
                    remaps.setdefault(w, remaps.get(getattr(w, ORIGINAL_ATTR, None)))
                    try:
                        delattr(w, INLINE_ATTR)
                    except AttributeError:
                        pass
    except Exception as e:
        log.warn_once("compile-remaps", "torch.compile may not rewrite in-place collectives", e)


_HOOKS = {DYNAMO: _on_dynamo, FUNCOL: _on_funcol}


def install() -> None:
    """Apply the Dynamo hooks now for the modules already imported, and when the others are
    (idempotent, never imports Dynamo)."""
    with _lock:
        pending = False
        for name, hook in _HOOKS.items():
            mod = sys.modules.get(name)
            if mod is not None and getattr(mod, "__spec__", None) is not None \
                    and not _initialising(mod):
                hook(mod)
            else:
                pending = True
        if pending:
            for name, hook in _HOOKS.items():
                importhook.on_import(name, hook)


def refresh_remaps() -> None:
    """Re-key the remaps after new wrappers were installed (funcol already imported)."""
    mod = sys.modules.get(FUNCOL)
    if mod is not None and not _initialising(mod):
        _on_funcol(mod)


def _initialising(mod) -> bool:
    spec = getattr(mod, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))
