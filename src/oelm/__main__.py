"""``python -m oelm ...``: the same command line as ``oelm``, for launchers that start a module
(``accelerate launch -m oelm run CONFIG``, ``torchrun --nproc_per_node=N -m oelm run CONFIG``)."""

import sys

from oelm.cli import main

sys.exit(main())
