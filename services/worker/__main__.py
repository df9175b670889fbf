"""``python -m t3ar_services.worker [--burst | check]``: run the adaptation worker (settings from T3AR_WORKER_*)."""

import sys

from t3ar_services.worker.main import main

sys.exit(main())
