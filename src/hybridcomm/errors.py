"""Exceptions raised by hybridcomm."""


class HybridCommError(RuntimeError):
    """Base class for failures detected while communicating (not for bad arguments)."""


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


class CapacityExceeded(HybridCommError):
    """Sizes read on the device asked for more rows than the buffers passed can hold."""
