"""python -m torchdeck.engine.supervisor RUN_DIR"""
import sys

from .loop import main

sys.exit(main())
