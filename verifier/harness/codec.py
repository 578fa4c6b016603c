"""The plain-data value codec shared by the program process, the evaluator and the judge.

Part of the judge's harness: ``harness.py`` (what is shipped into the jail) is generated from
this file, framing.py, control.py and runners.py by ``python -m verifier.harness.build``. The
judge imports this module directly (it decodes what the jail sends). Standard library only, and
nothing imported at all: it runs on the sandbox's Python at every jail's start-up.
"""

# ---------------------------------------------------------------------------------------------
# Plain-data encoding shared by the program process, the evaluator and the judge.
#
# JSON values stand for themselves (lists are lists); everything else is an object with a "$"
# tag: tuple, dict (as key/value pairs), set, frozenset, bytes, bytearray, complex, deque, big
# int (hex), obj (an entry of the object table, for instances of the shared classes: attributes
# only, so cycles and long linked lists are fine), ref (a remote handle), opaque (not data),
# np1 (a one-element numpy array returned by a call-based program, holding its element).

_MAX_DEPTH = 400


class EncodeError(Exception):
    pass


class Encoder:
    """``max_depth``: the deepest nesting sent (deeper is EncodeError). ``numbers``: Fraction
    and Decimal values are sent as data (tags ``fraction``, ``decimal``) for a judge that
    compares them with ``==`` (the lcb profile); otherwise they are opaque."""

    def __init__(self, known_classes=(), handle=None, seed=(), max_depth=_MAX_DEPTH,
                 numbers=False):
        self.max_depth = max_depth
        self.numbers = numbers
        self.known = set(known_classes)
        self.handle = handle
        self.objs = []
        self.memo = {}
        self.pending = []
        for o in seed:
            self._add_obj(o)

    def _add_obj(self, o):
        i = self.memo.get(id(o))
        if i is None:
            i = len(self.objs)
            self.memo[id(o)] = i
            self.objs.append([type(o).__name__, None, o])
            self.pending.append(i)
        return i

    def value(self, v, depth=0):
        if depth > self.max_depth:
            raise EncodeError("value nested too deeply")
        t = type(v)
        if v is None or t is bool or t is str:
            return v
        if t is int:
            if -(1 << 1000) < v < (1 << 1000):
                return v
            return {"$": "int", "v": format(v, "x")}
        if t is float:
            return v
        if t is list:
            return [self.value(x, depth + 1) for x in v]
        if t is tuple:
            return {"$": "tuple", "v": [self.value(x, depth + 1) for x in v]}
        if t is dict:
            return {
                "$": "dict",
                "v": [[self.value(k, depth + 1), self.value(x, depth + 1)] for k, x in v.items()],
            }
        if t is set or t is frozenset:
            return {"$": t.__name__, "v": [self.value(x, depth + 1) for x in v]}
        if t is bytes or t is bytearray:
            return {"$": t.__name__, "v": bytes(v).decode("latin-1")}
        if t is complex:
            return {"$": "complex", "v": [v.real, v.imag]}
        if t.__name__ in self.known and hasattr(v, "__dict__") and not isinstance(v, type):
            return {"$": "obj", "i": self._add_obj(v)}
        if (self.handle is None and t.__module__ == "numpy" and t.__name__ == "ndarray"
                and getattr(v, "ndim", 0) > 0 and getattr(v, "size", None) == 1):
            # A one-element array returned by a call-based program: LiveCodeBench compares the
            # result with == and reads the one-element boolean array that gives
            # (LiveCodeBench/LiveCodeBench at 28fef95, compute_code_generation_metrics.py,
            # evaluate_generations_by_problem: ndarray results read with .item(0)), so the
            # array equals any expected value that holds exactly one element equal to its own.
            # The judge applies that rule only under a profile with numpy (numpy_arrays).
            return {"$": "np1", "v": self.value(v.item(), depth + 1)}
        if t.__module__ == "numpy" and getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
            # A numpy scalar stands for its plain value (np.int64(5) == 5, as LiveCodeBench's
            # judge compares); larger arrays stay opaque (== is elementwise, and the truth of a
            # many-element result raises there: never a pass).
            return self.value(v.item(), depth + 1)
        # Subclasses of plain types are sent as their plain value.
        if isinstance(v, bool):
            return bool(v)
        if isinstance(v, int):
            return self.value(int.__int__(v), depth)
        if isinstance(v, float):
            return float.__float__(v)
        if isinstance(v, str):
            return str.__str__(v)
        if isinstance(v, dict):
            return {
                "$": "dict",
                "v": [
                    [self.value(k, depth + 1), self.value(x, depth + 1)] for k, x in dict.items(v)
                ],
            }
        if self.numbers and t.__module__ in ("fractions", "decimal", "_pydecimal"):
            # LiveCodeBench compares a returned Fraction or Decimal with ``==``
            # (LiveCodeBench/LiveCodeBench at 28fef95, testing_util.py, grade_call_based:
            # ``prediction == gt_out``): sent as the exact number, compared outside.
            if t.__name__ == "Fraction":
                return {"$": "fraction", "v": [self.value(int(v.numerator), depth + 1),
                                               self.value(int(v.denominator), depth + 1)]}
            if t.__name__ == "Decimal":
                return {"$": "decimal", "v": str(v)}
        if t.__name__ == "deque" and t.__module__ == "collections":
            return {"$": "deque", "v": [self.value(x, depth + 1) for x in v]}
        if isinstance(v, list):
            return [self.value(x, depth + 1) for x in list.__iter__(v)]
        if isinstance(v, tuple):
            return {"$": "tuple", "v": [self.value(x, depth + 1) for x in tuple.__iter__(v)]}
        if self.handle is not None:
            return {"$": "ref", "i": self.handle(v), "t": t.__name__}
        return {"$": "opaque", "t": t.__name__}

    def finish(self):
        """Encode the attributes of every table object (iteratively: no recursion along
        ``next`` pointers) and return the table."""
        while self.pending:
            i = self.pending.pop()
            entry = self.objs[i]
            o = entry[2]
            attrs = []
            for k, x in list(vars(o).items()):
                if type(k) is str:
                    attrs.append([k, self.value(x, 1)])
            entry[1] = attrs
        return [[name, attrs] for name, attrs, _ in self.objs]


def encode_message(value, known_classes=(), handle=None, max_depth=_MAX_DEPTH, numbers=False,
                   **extra):
    enc = Encoder(known_classes, handle, max_depth=max_depth, numbers=numbers)
    msg = dict(extra)
    msg["v"] = enc.value(value)
    msg["objs"] = enc.finish()
    return msg


class Opaque:
    """A value the other side could not send as data. Equal to nothing, not even itself."""

    __slots__ = ("type_name",)

    def __init__(self, type_name):
        self.type_name = type_name

    def __eq__(self, other):
        return False

    def __ne__(self, other):
        return True

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError(f"truth value of an opaque {self.type_name} object")

    def __repr__(self):
        return f"<opaque {self.type_name}>"


class DecodeError(Exception):
    pass


class Decoder:
    """Rebuild values. ``classes`` maps class names to the receiver's own classes for table
    objects; ``make_ref`` turns remote handles into proxies (else they become Opaque);
    ``seed`` are existing objects that the first table entries update in place."""

    def __init__(self, classes=None, make_ref=None, seed=()):
        self.classes = classes or {}
        self.make_ref = make_ref
        self.seed = list(seed)
        self.objs = []

    def table(self, objs):
        if not isinstance(objs, list):
            raise DecodeError("bad object table")
        made = []
        for i, entry in enumerate(objs):
            if not (
                isinstance(entry, list)
                and len(entry) == 2
                and isinstance(entry[0], str)
                and isinstance(entry[1], list)
            ):
                raise DecodeError("bad object entry")
            if i < len(self.seed):
                made.append(self.seed[i])
                continue
            cls = self.classes.get(entry[0])
            if cls is None:
                made.append(Opaque(entry[0]))
            else:
                made.append(cls.__new__(cls))
        self.objs = made
        for o, entry in zip(made, objs):
            if isinstance(o, Opaque):
                continue
            attrs = {}
            for pair in entry[1]:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                    raise DecodeError("bad attribute")
                attrs[pair[0]] = self.value(pair[1])
            d = vars(o)
            d.clear()
            d.update(attrs)

    def value(self, x, depth=0):
        if depth > _MAX_DEPTH + 5:
            raise DecodeError("value nested too deeply")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self.value(i, depth + 1) for i in x]
        if not isinstance(x, dict):
            raise DecodeError("bad value")
        tag = x.get("$")
        v = x.get("v")
        if tag == "tuple":
            return tuple(self._items(v, depth))
        if tag == "dict":
            if not isinstance(v, list):
                raise DecodeError("bad dict")
            out = {}
            for pair in v:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise DecodeError("bad dict item")
                k = self.value(pair[0], depth + 1)
                try:
                    out[k] = self.value(pair[1], depth + 1)
                except TypeError as e:
                    raise DecodeError(f"unhashable key: {e}")
            return out
        if tag in ("set", "frozenset"):
            try:
                s = set(self._items(v, depth))
            except TypeError as e:
                raise DecodeError(f"unhashable element: {e}")
            return s if tag == "set" else frozenset(s)
        if tag in ("bytes", "bytearray"):
            if not isinstance(v, str):
                raise DecodeError("bad bytes")
            b = v.encode("latin-1")
            return b if tag == "bytes" else bytearray(b)
        if tag == "complex":
            if not (
                isinstance(v, list)
                and len(v) == 2
                and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in v)
            ):
                raise DecodeError("bad complex")
            return complex(v[0], v[1])
        if tag == "deque":
            import collections  # lazy: in-jail start-up cost; only deque values need it

            return collections.deque(self._items(v, depth))
        if tag == "int":
            if not isinstance(v, str) or not v or len(v) > 1_000_000:
                raise DecodeError("bad int")
            try:
                return int(v, 16)
            except ValueError:
                raise DecodeError("bad int")
        if tag == "obj":
            i = x.get("i")
            if not isinstance(i, int) or not 0 <= i < len(self.objs):
                raise DecodeError("bad object reference")
            return self.objs[i]
        if tag == "ref":
            i = x.get("i")
            if not isinstance(i, (int, str)):
                raise DecodeError("bad handle")
            if self.make_ref is not None:
                return self.make_ref(i, str(x.get("t", "?")))
            return Opaque(str(x.get("t", "?")))
        if tag == "opaque":
            return Opaque(str(x.get("t", "?")))
        raise DecodeError(f"unknown tag {tag!r}")

    def _items(self, v, depth):
        if not isinstance(v, list):
            raise DecodeError("bad sequence")
        return [self.value(i, depth + 1) for i in v]


def decode_message(msg, classes=None, make_ref=None, seed=()):
    dec = Decoder(classes, make_ref, seed)
    dec.table(msg.get("objs", []))
    return dec, dec.value(msg.get("v"))
