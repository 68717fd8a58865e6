"""`python -m llm_replay.engine_stub serve ...`"""
import sys

from .cli import main

sys.exit(main())
