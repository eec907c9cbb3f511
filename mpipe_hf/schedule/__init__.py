"""Pure-Python schedule layer: action IR, interleaved 1F1B, MPipe layering, lowering, validation and the
discrete-event simulator.

Nothing here imports torch.distributed, so every function runs in milliseconds without processes.
"""

from .actions import Action, Kind, format_schedule, parse_schedule
from .config import ScheduleConfig
from .interleaved import body_order
from .lowering import ScheduleError
from .mpipe import build_schedule, strip_mpipe
from .simulate import Costs, Deadlock, Simulation, simulate
from .validate import validate

__all__ = ["Action", "Costs", "Deadlock", "Kind", "ScheduleConfig", "ScheduleError", "Simulation", "body_order",
           "build_schedule", "format_schedule", "parse_schedule", "simulate", "strip_mpipe", "validate"]
