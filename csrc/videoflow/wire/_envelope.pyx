# cython: language_level=3
"""Compiled envelope decoder: an accelerator for ``videoflow.wire.serialization``.

The envelope is defined by the msgspec Structs in serialization.py, and msgspec's
typed decode followed by ``asdict`` is the reference decoder. Building the Struct
and then copying it into a dict costs as much as parsing the bytes, so this module
parses the msgpack array of a v1-v3 envelope straight into the result dict.

It is proven equal to the reference on every input it accepts (values, value
types and zero-copy arrays: tests/unit/test_wire_compiled.py), and it accepts only
what it fully understands. On anything else -- bytes that are malformed,
truncated or followed by trailing bytes; a version tag that is not a positive
fixint 1-3; a field of the wrong msgpack type; an ext code it was not given; a
map key that is a container or an ext; nesting deeper than MAX_DEPTH; an input
that is not bytes, bytearray or a flat byte memoryview; any exception, including
one from the ext hook -- ``decode`` returns None and the caller runs the
reference. Every error message and every odd case is therefore the reference's
by construction, and this parser never has to reproduce one.
"""

cimport cython
from cpython.buffer cimport PyBUF_FULL_RO, PyBuffer_IsContiguous, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_CheckExact
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

cdef extern from "Python.h":
    # Declared here rather than cimported: Cython's own declarations take
    # non-const char* or steal references in ways that cost an extra incref.
    object _PyDict_NewPresized(Py_ssize_t minused)
    object PyDict_Copy(object d)
    int PyDict_SetItem(object d, object key, object value) except -1
    object PyList_New(Py_ssize_t size)
    void PyList_SET_ITEM(object lst, Py_ssize_t i, PyObject* item)
    object PyLong_FromLongLong(long long value)
    object PyLong_FromUnsignedLongLong(unsigned long long value)
    object PyFloat_FromDouble(double value)
    object PyBytes_FromStringAndSize(const char* s, Py_ssize_t size)
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)
    object PyUnicode_New(Py_ssize_t size, Py_UCS4 maxchar)
    void* PyUnicode_DATA(object s)
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    bint PyMemoryView_Check(object obj)  # memoryview cannot be subclassed
    Py_buffer* PyMemoryView_GET_BUFFER(object obj)
    object PyMemoryView_FromObject(object obj)

DECODER_KIND = "compiled"

# The v3 layout this parser implements, by position after the version tag; the
# constructor checks the caller's field names against it.
LAYOUT = (
    "trace_id", "seq", "message", "metadata", "is_stop_signal",
    "type", "producer_name", "flow_id", "run_id", "span_id", "parent_span_id",
    "replica_id", "blob_ref",
    "event_ts", "partition_key", "is_abort", "abort_origin", "abort_error",
)
cdef enum:
    # Containers nested deeper go to the reference, which has its own
    # (stack-based) limit and error message; no real message comes close.
    _MAX_DEPTH = 32
    N_FIELDS = 18
    N_V1 = 5
    N_V2 = 13
    # Header strings that repeat on every message of a stream: type,
    # producer_name, flow_id, run_id, abort_origin.
    N_CACHED = 5
    # Longer strings are rarely repeated header names; not worth the memcmp.
    CACHE_MAX_LEN = 64
    # Short strs in a message repeat on every message of a stream too: map keys
    # ("frame", "label") and enum-like values ("person", "cam-01"). A cached key
    # also keeps its hash, which the dict would otherwise compute.
    KEY_CACHE_SIZE = 512
    KEY_CACHE_MAX_LEN = 24


MAX_DEPTH = _MAX_DEPTH


def compose_decode_envelope(EnvelopeDecoder decoder not None, reference):
    """Returns decode_envelope: decoder's dict, or reference(data) for input it leaves.

    A compiled function rather than a Python one, so the common case pays no
    Python frame on top of the parse.

    Arguments:
        decoder: the compiled decoder.
        reference: the reference decode_envelope, which defines the result.

    Returns:
        A function of the received bytes with the reference's result and errors.
    """
    def decode_envelope(data):
        decoded = decoder._decode(data)
        if decoded is None:
            return reference(data)
        return decoded

    return decode_envelope


class _NotHandled(Exception):
    """Raised inside the parser for input it leaves to the reference decoder."""


cdef struct _Reader:
    const unsigned char* p
    const unsigned char* end
    const unsigned char* start
    PyObject* source  # borrowed: the object decode was given
    PyObject* view  # owned, created at the first ext: a memoryview of source


cdef inline uint16_t _u16(const unsigned char* p) noexcept nogil:
    return (<uint16_t>p[0] << 8) | p[1]


cdef inline uint32_t _u32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _u64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>_u32(p) << 32) | _u32(p + 4)


cdef inline const unsigned char* _take(_Reader* r, Py_ssize_t n) except NULL:
    """Consumes n bytes; refuses a length that runs past the end."""
    cdef const unsigned char* q = r.p
    if n < 0 or r.end - q < n:
        raise _NotHandled
    r.p = q + n
    return q


cdef inline Py_ssize_t _str_len(_Reader* r, unsigned char b) except -1:
    """The length of a str whose type byte is b; refuses any other type."""
    if 0xa0 <= b <= 0xbf:
        return b & 0x1f
    if b == 0xd9:
        return _take(r, 1)[0]
    if b == 0xda:
        return _u16(_take(r, 2))
    if b == 0xdb:
        return _u32(_take(r, 4))
    raise _NotHandled


cdef object _decode_str(const unsigned char* q, Py_ssize_t n):
    """A str from UTF-8 bytes, decoded strictly as the reference decodes it."""
    cdef unsigned char high = 0
    cdef Py_ssize_t i
    cdef object s
    for i in range(n):
        high |= q[i]
    if high < 0x80 and n > 1:
        # ASCII, the usual case: skip the general decoder's dispatch.
        s = PyUnicode_New(n, 127)
        memcpy(PyUnicode_DATA(s), q, n)
        return s
    return PyUnicode_DecodeUTF8(<const char*>q, n, "strict")


cdef inline object _read_str(_Reader* r, Py_ssize_t n):
    return _decode_str(_take(r, n), n)


cdef object _read_int(_Reader* r, unsigned char b):
    """An int of any msgpack width; refuses every other type (bool included)."""
    if b <= 0x7f:
        return PyLong_FromLongLong(b)
    if b >= 0xe0:
        return PyLong_FromLongLong(<int8_t>b)
    if b == 0xcc:
        return PyLong_FromLongLong(_take(r, 1)[0])
    if b == 0xcd:
        return PyLong_FromLongLong(_u16(_take(r, 2)))
    if b == 0xce:
        return PyLong_FromLongLong(_u32(_take(r, 4)))
    if b == 0xcf:
        return PyLong_FromUnsignedLongLong(_u64(_take(r, 8)))
    if b == 0xd0:
        return PyLong_FromLongLong(<int8_t>_take(r, 1)[0])
    if b == 0xd1:
        return PyLong_FromLongLong(<int16_t>_u16(_take(r, 2)))
    if b == 0xd2:
        return PyLong_FromLongLong(<int32_t>_u32(_take(r, 4)))
    if b == 0xd3:
        return PyLong_FromLongLong(<int64_t>_u64(_take(r, 8)))
    raise _NotHandled


cdef double _read_number(_Reader* r, unsigned char b) except? -1.0:
    """A float or int as a double, converted as the reference converts it."""
    cdef uint32_t bits32
    cdef uint64_t bits64
    cdef float f
    cdef double d
    if b == 0xca:
        bits32 = _u32(_take(r, 4))
        memcpy(&f, &bits32, 4)
        return f
    if b == 0xcb:
        bits64 = _u64(_take(r, 8))
        memcpy(&d, &bits64, 8)
        return d
    if b <= 0x7f:
        return b
    if b >= 0xe0:
        return <int8_t>b
    if b == 0xcc:
        return _take(r, 1)[0]
    if b == 0xcd:
        return _u16(_take(r, 2))
    if b == 0xce:
        return _u32(_take(r, 4))
    if b == 0xcf:
        return <double>_u64(_take(r, 8))
    if b == 0xd0:
        return <int8_t>_take(r, 1)[0]
    if b == 0xd1:
        return <int16_t>_u16(_take(r, 2))
    if b == 0xd2:
        return <int32_t>_u32(_take(r, 4))
    if b == 0xd3:
        return <double><int64_t>_u64(_take(r, 8))
    raise _NotHandled


cdef inline bint _is_container_or_ext(unsigned char b) noexcept nogil:
    return (
        0x80 <= b <= 0x9f  # fixmap, fixarray
        or 0xc7 <= b <= 0xc9  # ext 8/16/32
        or 0xd4 <= b <= 0xd8  # fixext
        or 0xdc <= b <= 0xdf  # array/map 16/32
    )


@cython.final
cdef class EnvelopeDecoder:
    """Parses envelope bytes into the dict the reference decoder returns, or None.

    One instance serves a process. It remembers what repeats from message to
    message of a stream -- the last str of each header string field, short strs
    in messages (map keys above all), and the header values in the result
    template -- so a repeating header costs a byte comparison, not a decode and a
    dict write. That state is read and written only between calls into Python,
    so the GIL keeps it consistent even while an ext hook runs in another thread.
    """

    cdef tuple _keys
    cdef tuple _defaults
    cdef dict _template
    # The value each field has in _template (borrowed: the template owns them).
    cdef PyObject* _current[N_FIELDS]
    cdef object _ext_hook
    cdef unsigned int _ext_mask  # bit c set: ext code c goes to _ext_hook
    cdef PyObject* _cached[N_CACHED]
    cdef const char* _cached_utf8[N_CACHED]
    cdef Py_ssize_t _cached_len[N_CACHED]
    cdef PyObject* _key_cache[KEY_CACHE_SIZE]
    cdef const char* _key_cache_utf8[KEY_CACHE_SIZE]
    cdef Py_ssize_t _key_cache_len[KEY_CACHE_SIZE]

    def __cinit__(self):
        cdef int i
        for i in range(N_CACHED):
            self._cached[i] = NULL
            self._cached_len[i] = -1
        for i in range(KEY_CACHE_SIZE):
            self._key_cache[i] = NULL
            self._key_cache_len[i] = -1

    def __init__(self, tuple fields, tuple defaults, ext_hook, ext_codes=(1, 2)):
        if fields != LAYOUT:
            raise ValueError(f"envelope fields {fields!r} are not the layout this decoder parses")
        if len(defaults) != N_FIELDS - N_V1:
            raise ValueError(f"expected {N_FIELDS - N_V1} defaults, got {len(defaults)}")
        self._keys = fields
        # Every result starts as a copy of the template, and a field is stored only
        # if its value is not the very object already there. The template starts
        # as the defaults, which a typical envelope mostly keeps, and then follows
        # the header fields that repeat on every message of a stream (type,
        # producer_name, flow_id, run_id, replica_id, abort_origin), so a stream's
        # header costs no dict writes at all.
        self._defaults = (None, None, None, None, False) + defaults
        self._template = dict(zip(fields, self._defaults))
        cdef Py_ssize_t i
        for i in range(N_FIELDS):
            self._current[i] = <PyObject*>self._defaults[i]
        self._ext_hook = ext_hook
        self._ext_mask = 0
        for code in ext_codes:
            if not 0 <= code < 32:
                raise ValueError(f"ext codes handed to the hook must be in 0..31, not {code!r}")
            self._ext_mask |= 1u << code

    def __dealloc__(self):
        cdef int i
        for i in range(N_CACHED):
            Py_XDECREF(self._cached[i])
        for i in range(KEY_CACHE_SIZE):
            Py_XDECREF(self._key_cache[i])

    def decode(self, data):
        """Decodes an envelope the way the reference does, if this parser handles it.

        Arguments:
            data: the received bytes (bytes, bytearray or memoryview).

        Returns:
            The dict the reference decoder returns for data, or None if data is
            anything this parser leaves to the reference (see the module docstring).
        """
        return self._decode(data)

    cdef object _decode(self, object data):
        cdef _Reader r
        cdef Py_buffer buf
        cdef bint held = False
        if self._template is None:  # made with __new__, never initialised
            return None
        r.source = <PyObject*>data
        r.view = NULL
        if PyBytes_CheckExact(data):
            r.start = <const unsigned char*>PyBytes_AS_STRING(data)
            r.end = r.start + PyBytes_GET_SIZE(data)
        elif PyByteArray_CheckExact(data) or PyMemoryView_Check(data):
            # Held for the whole parse: the ext hook runs Python code, which
            # must not resize or release the buffer under the parser.
            try:
                PyObject_GetBuffer(data, &buf, PyBUF_FULL_RO)
            except Exception:  # e.g. a released memoryview: the reference words it
                return None
            held = True
            # Ext views are sliced in bytes, so only a flat byte buffer maps
            # offsets the way the reference's views do.
            if buf.itemsize != 1 or buf.ndim != 1 or (
                buf.format != NULL and (buf.format[0] != b"B" or buf.format[1] != 0)
            ) or not PyBuffer_IsContiguous(&buf, b"C"):
                PyBuffer_Release(&buf)
                return None
            r.start = <const unsigned char*>buf.buf
            r.end = r.start + buf.len
        else:
            return None
        r.p = r.start
        try:
            return self._envelope(&r)
        except Exception:
            # Anything at all: the reference decides (and words the error).
            return None
        finally:
            Py_XDECREF(r.view)
            if held:
                PyBuffer_Release(&buf)

    cdef object _envelope(self, _Reader* r):
        cdef unsigned char b = _take(r, 1)[0]
        cdef Py_ssize_t n, i, last
        cdef object d, value
        cdef tuple keys = self._keys
        if 0x90 <= b <= 0x9f:
            n = b & 0x0f
        elif b == 0xdc:
            n = _u16(_take(r, 2))
        elif b == 0xdd:
            n = _u32(_take(r, 4))
        else:
            raise _NotHandled
        # n counts the version tag too.
        b = _take(r, 1)[0]
        if b == 1:
            last = 1 + N_V1
        elif b == 2:
            last = 1 + N_V2
        elif b == 3:
            last = 1 + N_FIELDS
        else:
            raise _NotHandled
        if n < 1 + N_V1 or n > last:
            raise _NotHandled
        d = PyDict_Copy(self._template)
        PyDict_SetItem(d, keys[0], _read_str(r, _str_len(r, _take(r, 1)[0])))
        PyDict_SetItem(d, keys[1], _read_int(r, _take(r, 1)[0]))
        self._put(d, 2, self._any(r, 1))
        b = _take(r, 1)[0]
        if b != 0xc0:
            if not (0x80 <= b <= 0x8f or b == 0xde or b == 0xdf):
                raise _NotHandled
            r.p -= 1
            PyDict_SetItem(d, keys[3], self._any(r, 1))
        self._put(d, 4, self._bool(r))
        for i in range(N_V1, n - 1):
            if i <= 8:  # type, producer_name, flow_id, run_id
                self._follow(d, i, self._header_str(r, i - 5))
                continue
            elif i == 9 or i == 10:
                value = self._span_id(r)
            elif i == 11:
                self._follow(d, i, _read_int(r, _take(r, 1)[0]))
                continue
            elif i == 12:
                value = self._str_or_none(r, -1)
            elif i == 13:
                b = _take(r, 1)[0]
                value = None if b == 0xc0 else PyFloat_FromDouble(_read_number(r, b))
            elif i == 15:
                value = self._bool(r)
            elif i == 16:
                self._follow(d, i, self._str_or_none(r, 4))
                continue
            else:  # partition_key, abort_error: any value
                value = self._any(r, 1)
            self._put(d, i, value)
        # The fields an older or shorter envelope leaves out take their defaults.
        for i in range(n - 1, N_FIELDS):
            self._put(d, i, self._defaults[i])
        if r.p != r.end:
            raise _NotHandled
        return d

    cdef inline int _put(self, object d, Py_ssize_t i, object value) except -1:
        """Stores field i of the result d, unless the template already holds value."""
        if <PyObject*>value != self._current[i]:
            PyDict_SetItem(d, self._keys[i], value)
        return 0

    cdef inline int _follow(self, object d, Py_ssize_t i, object value) except -1:
        """Stores field i as _put does, and makes value the template's from now on."""
        if <PyObject*>value != self._current[i]:
            PyDict_SetItem(d, self._keys[i], value)
            PyDict_SetItem(self._template, self._keys[i], value)
            self._current[i] = <PyObject*>value
        return 0

    cdef object _bool(self, _Reader* r):
        cdef unsigned char b = _take(r, 1)[0]
        if b == 0xc3:
            return True
        if b == 0xc2:
            return False
        raise _NotHandled

    cdef object _str_or_none(self, _Reader* r, int slot):
        if _take(r, 1)[0] == 0xc0:
            return None
        r.p -= 1
        if slot < 0:
            return _read_str(r, _str_len(r, _take(r, 1)[0]))
        return self._header_str(r, slot)

    cdef object _span_id(self, _Reader* r):
        """Any value; a str is decoded afresh, since span ids differ per message
        and would only evict the cache's repeating strs."""
        cdef unsigned char b = _take(r, 1)[0]
        if 0xa0 <= b <= 0xbf or 0xd9 <= b <= 0xdb:
            return _read_str(r, _str_len(r, b))
        r.p -= 1
        return self._any(r, 1)

    cdef object _header_str(self, _Reader* r, int slot):
        """A str field, reusing the last str this slot decoded if the bytes match."""
        cdef Py_ssize_t n = _str_len(r, _take(r, 1)[0])
        cdef const unsigned char* q = _take(r, n)
        cdef PyObject* cached = self._cached[slot]
        cdef object s
        cdef Py_ssize_t size
        cdef const char* utf8
        # Strict UTF-8 decoding is one-to-one, so equal bytes mean an equal str.
        if n == self._cached_len[slot] and memcmp(self._cached_utf8[slot], q, n) == 0:
            return <object>cached
        s = _decode_str(q, n)
        if n <= CACHE_MAX_LEN:
            utf8 = PyUnicode_AsUTF8AndSize(s, &size)
            Py_INCREF(s)
            self._cached[slot] = <PyObject*>s
            self._cached_utf8[slot] = utf8
            self._cached_len[slot] = size
            Py_XDECREF(cached)
        return s

    cdef object _short_str(self, _Reader* r, Py_ssize_t n):
        """A str in a message, through a small cache keyed by its bytes."""
        cdef const unsigned char* q = _take(r, n)
        cdef uint32_t h
        cdef Py_ssize_t i, size
        cdef PyObject* cached
        cdef object s
        cdef const char* utf8
        if n > KEY_CACHE_MAX_LEN:
            return _decode_str(q, n)
        h = <uint32_t>2166136261  # FNV-1a
        for i in range(n):
            h = (h ^ q[i]) * <uint32_t>16777619
        h = (h ^ (h >> 16)) % KEY_CACHE_SIZE
        cached = self._key_cache[h]
        if n == self._key_cache_len[h] and memcmp(self._key_cache_utf8[h], q, n) == 0:
            return <object>cached
        s = _decode_str(q, n)
        utf8 = PyUnicode_AsUTF8AndSize(s, &size)
        Py_INCREF(s)
        self._key_cache[h] = <PyObject*>s
        self._key_cache_utf8[h] = utf8
        self._key_cache_len[h] = size
        Py_XDECREF(cached)
        return s

    cdef object _any(self, _Reader* r, int depth):
        """Any msgpack value as the reference's untyped decode builds it."""
        cdef unsigned char b = _take(r, 1)[0]
        cdef uint32_t bits32
        cdef uint64_t bits64
        cdef float f
        cdef double dbl
        cdef Py_ssize_t n
        if b <= 0x7f or b >= 0xe0 or 0xcc <= b <= 0xd3:
            return _read_int(r, b)
        if 0xa0 <= b <= 0xbf or 0xd9 <= b <= 0xdb:
            return self._short_str(r, _str_len(r, b))
        if 0x80 <= b <= 0x8f:
            return self._map(r, b & 0x0f, depth)
        if 0x90 <= b <= 0x9f:
            return self._array(r, b & 0x0f, depth)
        if b == 0xc0:
            return None
        if b == 0xc2:
            return False
        if b == 0xc3:
            return True
        if b == 0xca:
            bits32 = _u32(_take(r, 4))
            memcpy(&f, &bits32, 4)
            return PyFloat_FromDouble(f)
        if b == 0xcb:
            bits64 = _u64(_take(r, 8))
            memcpy(&dbl, &bits64, 8)
            return PyFloat_FromDouble(dbl)
        if 0xc4 <= b <= 0xc6:
            if b == 0xc4:
                n = _take(r, 1)[0]
            elif b == 0xc5:
                n = _u16(_take(r, 2))
            else:
                n = _u32(_take(r, 4))
            return PyBytes_FromStringAndSize(<const char*>_take(r, n), n)
        if b == 0xdc:
            return self._array(r, _u16(_take(r, 2)), depth)
        if b == 0xdd:
            return self._array(r, _u32(_take(r, 4)), depth)
        if b == 0xde:
            return self._map(r, _u16(_take(r, 2)), depth)
        if b == 0xdf:
            return self._map(r, _u32(_take(r, 4)), depth)
        if 0xd4 <= b <= 0xd8:
            return self._ext(r, 1 << (b - 0xd4))
        if b == 0xc7:
            return self._ext(r, _take(r, 1)[0])
        if b == 0xc8:
            return self._ext(r, _u16(_take(r, 2)))
        if b == 0xc9:
            return self._ext(r, _u32(_take(r, 4)))
        raise _NotHandled  # 0xc1, never used

    cdef object _array(self, _Reader* r, Py_ssize_t n, int depth):
        cdef Py_ssize_t i
        cdef object lst, item
        # Every element takes at least one byte: refuse a length the data cannot
        # hold before allocating for it.
        if depth >= _MAX_DEPTH or n > r.end - r.p:
            raise _NotHandled
        lst = PyList_New(n)
        for i in range(n):
            item = self._any(r, depth + 1)
            Py_INCREF(item)
            PyList_SET_ITEM(lst, i, <PyObject*>item)
        return lst

    cdef object _map(self, _Reader* r, Py_ssize_t n, int depth):
        cdef Py_ssize_t i
        cdef unsigned char b
        cdef object d, key
        if depth >= _MAX_DEPTH or n > (r.end - r.p) // 2:
            raise _NotHandled
        d = _PyDict_NewPresized(n)
        for i in range(n):
            b = _take(r, 1)[0]
            if 0xa0 <= b <= 0xbf:
                key = self._short_str(r, b & 0x1f)
            elif _is_container_or_ext(b) or b == 0xc1:
                # The reference makes tuples of array keys and would hash
                # whatever an ext hook returns; leave all of that to it.
                raise _NotHandled
            else:
                r.p -= 1
                key = self._any(r, depth + 1)
            # Insertion in wire order: a repeated key keeps its first position and
            # its last value, as in the reference.
            PyDict_SetItem(d, key, self._any(r, depth + 1))
        return d

    cdef object _ext(self, _Reader* r, Py_ssize_t n):
        cdef int8_t code = <int8_t>_take(r, 1)[0]
        cdef const unsigned char* q = _take(r, n)
        cdef Py_ssize_t offset = q - r.start
        cdef object view
        if code < 0 or code >= 32 or not (self._ext_mask >> code) & 1:
            raise _NotHandled
        if r.view == NULL:
            view = PyMemoryView_FromObject(<object>r.source)
            Py_INCREF(view)
            r.view = <PyObject*>view
        # A slice of a view of the input itself, as the reference hands its hook:
        # arrays share the input's memory and its read-only flag.
        return self._ext_hook(code, (<object>r.view)[offset:offset + n])
