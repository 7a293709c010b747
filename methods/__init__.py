"""Layer 2, the methods: the method protocol, the registry, and one module per method family. Each method
module is imported here so its decorator runs. The methods import only core and the datasets below them; what
they see of a run is their own protocol, `MethodContext` (context.py), which the engine satisfies.

Adding a method: write methods/<name>.py with a `Method` subclass decorated by
`@register_method("<name>")`, then add its import below. A method in another package is a
plugin instead (methods/plugins.py: an entry point, --plugin or DFBENCH_PLUGINS).
"""

from .base import (Capabilities, ClientPlan, EdgeLoad, LocalStep, Mechanism, Method, SampleVariants, ServerState,
                   Upload, masked_weighted_mean)
from .context import MethodContext, ParamLayout
from .registry import (create_method, get_method_class, list_methods, method_config, method_families, method_help,
                       register_method)

# Method modules (imported for their @register_method side effect).
from . import fedavg  # noqa: F401,E402
from . import experts  # noqa: F401,E402
from . import pruning  # noqa: F401,E402
from . import balanced_prune  # noqa: F401,E402
from . import quantized  # noqa: F401,E402
from . import serveropt  # noqa: F401,E402
from . import scaffold  # noqa: F401,E402
from . import heterofl  # noqa: F401,E402
from . import fedrolex  # noqa: F401,E402
from . import fjord  # noqa: F401,E402
from . import fedphd  # noqa: F401,E402
from . import topk_update  # noqa: F401,E402
from . import signsgd  # noqa: F401,E402
from . import qsgd  # noqa: F401,E402
from . import powersgd  # noqa: F401,E402
from . import exact_score  # noqa: F401,E402

__all__ = [
    "Capabilities", "ClientPlan", "EdgeLoad", "LocalStep", "Mechanism", "Method", "MethodContext", "ParamLayout",
    "SampleVariants", "ServerState", "Upload", "masked_weighted_mean",
    "create_method", "get_method_class", "list_methods", "method_config", "method_families", "method_help",
    "register_method",
]
