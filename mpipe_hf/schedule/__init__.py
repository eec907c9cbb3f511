"""Pure-Python schedule layer: action IR, interleaved 1F1B, MPipe layering, lowering and validation.

Nothing here imports torch.distributed, so every function runs in milliseconds without processes.
"""

from .actions import Action, Kind, format_schedule, parse_schedule
from .config import ScheduleConfig
from .interleaved import body_order
from .lowering import ScheduleError
from .mpipe import build_schedule, strip_mpipe
from .validate import simulate, validate

__all__ = ["Action", "Kind", "ScheduleConfig", "ScheduleError", "body_order", "build_schedule", "format_schedule",
           "parse_schedule", "simulate", "strip_mpipe", "validate"]
