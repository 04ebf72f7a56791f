"""Prompt-injection defences, as layers that compose (see docs/guide/safety.md).

- escape: tool output rendered as data, unable to forge a protocol tag (used by the parsers);
- detector: rules and an optional classifier scoring instructions hidden in tool output;
- policy: allow-lists, argument rules, sensitive and trusted tools;
- monitor: flags call sequences that look like a followed injection;
- guard: all of them around the tool calls of an episode, with confirmation of sensitive
  calls and the information-flow rule.
"""

from ponder.tools.safety.detector import Detection, EmbeddingClassifier, InjectionDetector, Rule
from ponder.tools.safety.escape import escape_untrusted, source_header, unescape_untrusted
from ponder.tools.safety.guard import Confirm, Guard, GuardOptions, GuardSession
from ponder.tools.safety.monitor import MonitorFlag, TrajectoryMonitor, events_from_turns
from ponder.tools.safety.policy import ArgumentRule, SafetyPolicy, ToolRule

__all__ = [
    "ArgumentRule",
    "Confirm",
    "Detection",
    "EmbeddingClassifier",
    "Guard",
    "GuardOptions",
    "GuardSession",
    "InjectionDetector",
    "MonitorFlag",
    "Rule",
    "SafetyPolicy",
    "ToolRule",
    "TrajectoryMonitor",
    "escape_untrusted",
    "events_from_turns",
    "source_header",
    "unescape_untrusted",
]
