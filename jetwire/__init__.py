"""jetwire: the jet wire format v1 (spec/PROTOCOL.md) and event-log format (spec/JETLOG.md).

Pure and sans-IO: bytes in, typed messages out, and back. No sockets, no asyncio, no
clock.

    >>> from jetwire import Decoder, SetState, Value, encode
    >>> frame = encode(SetState(7, "plant/temp", Value.of(21.5)))
    >>> decoder = Decoder()
    >>> decoder.receive_data(frame)
    >>> decoder.next_message()
    SetState(id=7, key='plant/temp', value=Value(FLOAT64, 21.5))
"""

from __future__ import annotations

from . import _pure  # noqa: F401  # first: with JET_PURE_PYTHON=1 the codec runs from source
from . import codec
from . import codes
from . import errors
from . import messages
from . import values

# The package is the public names of its modules, each listed once in that module's
# __all__ (the codec's: the stream Decoder, encode and the decode functions).
from .codec import *  # noqa: F403
from .codes import *  # noqa: F403
from .errors import *  # noqa: F403
from .messages import *  # noqa: F403
from .values import *  # noqa: F403

__version__ = "0.1.0"

__all__ = [*codec.__all__, *codes.__all__, *errors.__all__, *messages.__all__, *values.__all__]
