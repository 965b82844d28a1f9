"""One registry of every attribute commtrace replaced, so that nothing is wrapped twice and
every original can be restored.

A patch is keyed by (owner object, attribute name). Patching the same attribute again is a no-op
(the first original is kept); :func:`restore` puts the original back.
"""

from __future__ import annotations

_ORIGINALS: dict[tuple[int, str], tuple[object, str, object, object]] = {}

#: Attribute set on every wrapper we create; its value is the wrapped original.
ORIGINAL_ATTR = "__commtrace_original__"


def original_of(fn):
    """The unwrapped original of `fn` (or `fn` itself when it is not one of our wrappers)."""
    return getattr(fn, ORIGINAL_ATTR, fn)


def is_wrapper(fn) -> bool:
    return hasattr(fn, ORIGINAL_ATTR)


def patch(owner, name: str, new) -> bool:
    """Replace ``owner.name`` with `new`, remembering the original. Returns False (and does
    nothing) when that attribute is already patched by us."""
    key = (id(owner), name)
    if key in _ORIGINALS:
        return False
    try:
        old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    except (KeyError, AttributeError):
        old = getattr(owner, name, None)
    if is_wrapper(old):
        return False
    _ORIGINALS[key] = (owner, name, old, new)
    setattr(owner, name, new)
    if is_wrapper(new):
        # Under torch.compile, Dynamo traces the original, never the wrapper (compile.py).
        from . import compile as _compile

        _compile.mark(new, owner=owner)
    return True


def swap(owner, name: str, new) -> bool:
    """Replace the wrapper installed at ``owner.name`` by `new` (another form of it), keeping
    the original for :func:`restore`. Returns False when that attribute is not patched by us."""
    entry = _ORIGINALS.get((id(owner), name))
    if entry is None:
        return False
    _ORIGINALS[(id(owner), name)] = (entry[0], name, entry[2], new)
    setattr(owner, name, new)
    return True


def patched(owner, name: str) -> bool:
    return (id(owner), name) in _ORIGINALS


def get_original(owner, name: str):
    """Original of a patched attribute, or the current attribute when not patched."""
    entry = _ORIGINALS.get((id(owner), name))
    return entry[2] if entry else getattr(owner, name)


def restore(owner=None, name: str | None = None) -> int:
    """Restore one patched attribute, all of one owner (name None), or everything (owner None).
    Returns how many were restored."""
    n = 0
    for key, (o, nm, old, new) in list(_ORIGINALS.items()):
        if owner is not None and o is not owner:
            continue
        if name is not None and nm != name:
            continue
        try:
            cur = o.__dict__.get(nm) if isinstance(o, type) else getattr(o, nm, None)
            if cur is new:
                setattr(o, nm, old)
        except Exception:
            pass
        del _ORIGINALS[key]
        if not any(e[3] is new for e in _ORIGINALS.values()):
            from . import compile as _compile

            _compile.unmark(new)
        n += 1
    return n


def entries() -> list[tuple[object, str]]:
    return [(o, nm) for (o, nm, _old, _new) in _ORIGINALS.values()]
