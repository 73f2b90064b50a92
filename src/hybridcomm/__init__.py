"""hybridcomm: token transitions between DP/TP attention and EP/TP MoE layers.

    import hybridcomm as hc
    comm = hc.Communicator(hc.Layout(4, attn_tp=2, moe_tp=2))
    tokens = comm.gather_tokens(attn_out, dp_sizes)      # before the MoE
    mine = comm.scatter_tokens(moe_out, dp_sizes)        # after it
"""

from .communicator import Communicator
from .counts import Counts
from .errors import ArgumentMismatch, CapacityExceeded, CommunicatorClosed, HybridCommError, PeerTimeout
from .layout import GROUP_NAMES, Layout, RankCoords
from .quant import FORMATS as QUANT_FORMATS, QuantizedRows, swizzle_128x4

__all__ = ["Communicator", "Counts", "Layout", "RankCoords", "GROUP_NAMES", "PeerTimeout",
           "CapacityExceeded", "HybridCommError", "ArgumentMismatch", "CommunicatorClosed", "QuantizedRows",
           "QUANT_FORMATS", "swizzle_128x4"]
__version__ = "0.1.0"
