"""torch.distributed runtime: P2P with shape headers, the handler table, the executor and the mesh."""

from .executor import PipelineExecutor, StepStats
from .handlers import HANDLERS
from .mesh import build_mesh, init_distributed
from .p2p import P2P
from .step_context import Preprocess, StepContext
from .watchdog import PeerFailed, Watchdog

__all__ = ["HANDLERS", "P2P", "PeerFailed", "PipelineExecutor", "Preprocess", "StepContext", "StepStats", "Watchdog",
           "build_mesh", "init_distributed"]
