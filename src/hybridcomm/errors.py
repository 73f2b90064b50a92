"""Exceptions raised by hybridcomm."""


class HybridCommError(RuntimeError):
    """Base class for failures detected while communicating (not for bad arguments)."""

    def __reduce__(self):
        # Pickle (a worker process sending the error to its parent) restores the message and
        # the attributes without calling __init__, whose arguments differ between subclasses.
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type, args: tuple, attributes: dict) -> HybridCommError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(attributes)
    return error


class PeerTimeout(HybridCommError):
    """A kernel waited past its deadline for a peer; the communicator is unusable afterwards.

    Raised by the first host call after the kernel recorded the timeout (or by
    `Communicator.check_errors()`), with the op, the group and the peer it waited for.
    """

    def __init__(self, op: str, group: str, peer: int | tuple[int, ...], timeout_s: float):
        self.op, self.group, self.peer, self.timeout_s = op, group, peer, timeout_s
        who = f"peer rank {peer}" if isinstance(peer, int) else f"one of peer ranks {list(peer)}"
        super().__init__(
            f"{op} on group {group!r}: {who} did not arrive within {timeout_s:g} s "
            f"(did that rank skip or reorder a call?). This communicator cannot be used any more."
        )


class CommunicatorClosed(HybridCommError):
    """An op on a Communicator after its close()."""


class CapacityExceeded(HybridCommError):
    """Sizes read on the device asked for more rows than the buffers passed can hold."""


class ArgumentMismatch(HybridCommError, ValueError):
    """Arguments that must agree across the ranks of a call do not (or a peer rejected its own).

    Found on the host (validate=True, or the reference backend's header exchange): raised on
    every rank of the call, naming the argument and the ranks that differ. Found on the device
    (`on_device`): a peer's call differed from this rank's -- another op (a skipped or
    reordered call), dtype, algorithm, attn_tp / partial, row counts or row width -- at no cost
    to calls that agree, by every rank that received the call; raised by the next host call (or
    `Communicator.check_errors()`, which synchronises, so every rank raises at the same point).
    That call's output is not valid (every access stayed within its buffers); calls queued
    after it before the error was raised ran normally. The communicator stays usable when the
    ranks raise at the same call, which `check_errors()` guarantees; raised by an ordinary call,
    the host check races with the kernel, and a peer that went on into that call waits for this
    rank until it raises PeerTimeout.
    """

    op = group = peer = field = None

    @classmethod
    def on_device(cls, op: str, group: str, peer: int, field: str) -> "ArgumentMismatch":
        e = cls(f"{op} on group {group!r}: rank {peer}'s call differs from this rank's in its {field}; "
                f"every rank of a group must make the same calls in the same order with the same dtype, "
                f"row width and sizes. That call's output is not valid; the communicator stays usable "
                f"when every rank raised at the same call (check_errors() makes sure).")
        e.op, e.group, e.peer, e.field = op, group, peer, field
        return e
