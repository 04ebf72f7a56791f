"""Conversational training data: TRL-style records, readers, formatting with
assistant-only loss masks, and conversion from Trajectory records."""

from ponder.data.convert import (
    KIND_TO_TASK_TYPE,
    preference_from_trajectories,
    response_messages,
    successful_conversations,
    task_type_of,
    trajectory_to_conversation,
)
from ponder.data.format import STYLES, ChatFormatter, TokenizedExample, pack
from ponder.data.io import load_conversations, load_preferences, read_rows, write_jsonl
from ponder.data.records import (
    TASK_TYPES,
    Conversation,
    DataError,
    LoadReport,
    PreferencePair,
    parse_rows,
)

__all__ = [
    "KIND_TO_TASK_TYPE",
    "STYLES",
    "TASK_TYPES",
    "ChatFormatter",
    "Conversation",
    "DataError",
    "LoadReport",
    "PreferencePair",
    "TokenizedExample",
    "load_conversations",
    "load_preferences",
    "pack",
    "parse_rows",
    "preference_from_trajectories",
    "read_rows",
    "response_messages",
    "successful_conversations",
    "task_type_of",
    "trajectory_to_conversation",
    "write_jsonl",
]
