"""``python -I -m wrapper.watch JOBID --node N --attempt A --gpus 0,1`` (started by the prolog)."""

import sys

from wrapper.watch.process import main

sys.exit(main())
