"""Read-only JSON containers: what a record holds where JSON holds an object or an array.

Records are deeply immutable, so a record read can be shared by every reader
(and by the codec's cache) with no copy. A :class:`FrozenDict` is a ``dict``
and a :class:`FrozenList` a ``list`` in every way but one: any attempt to
change one raises ``TypeError``. Being a ``dict`` and a ``list`` they compare
equal to plain ones, serialize to the same JSON (``json``, pydantic, BSON), and
pass ``isinstance`` checks. To change a value, build a new one::

    changed = {**thread.metadata, "pinned": True}     # a plain dict
    items = [*message.parts, new_part]                # a plain list

:func:`freeze` makes the read-only form of any JSON value, at every depth.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["EMPTY_DICT", "EMPTY_LIST", "FrozenDict", "FrozenList", "freeze"]


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(
        f"a record's {type(self).__mro__[1].__name__} is read-only: build a new value "
        "(e.g. {**value, ...} or [*value, ...]) and a new record"
    )


class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses every change (``TypeError``)."""

    __slots__ = ()

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def copy(self) -> dict[str, Any]:
        """A plain (changeable) ``dict`` of the same items."""
        return dict(self)

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


class FrozenList(list[Any]):
    """A ``list`` that refuses every change (``TypeError``)."""

    __slots__ = ()

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def copy(self) -> list[Any]:
        """A plain (changeable) ``list`` of the same items."""
        return list(self)

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))


def freeze(value: Any) -> Any:
    """``value`` with every ``dict`` and ``list`` in it made read-only (new
    containers, one shared empty one of each; a value already frozen is
    returned as it is)."""
    kind = type(value)
    if kind is dict:
        if not value:
            return EMPTY_DICT
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if kind is list:
        if not value:
            return EMPTY_LIST
        return FrozenList([freeze(item) for item in value])
    return value


EMPTY_DICT = FrozenDict()
EMPTY_LIST = FrozenList()
