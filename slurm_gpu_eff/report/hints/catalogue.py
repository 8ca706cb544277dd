"""Every rule, in the order the docs list them and ties in the hints are broken."""

from __future__ import annotations

from .core import Rule
from .gpu_use import RULES as GPU_USE
from .hardware import RULES as HARDWARE
from .host import RULES as HOST
from .kernels import RULES as KERNELS
from .links import RULES as LINKS
from .memory import RULES as MEMORY
from .sm import RULES as SM

RULES: tuple[Rule, ...] = (*GPU_USE, *SM, *KERNELS, *MEMORY, *LINKS, *HOST, *HARDWARE)
RULE_BY_ID = {rule.id: rule for rule in RULES}
