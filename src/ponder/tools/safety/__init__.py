"""Prompt-injection defences, as layers that compose (see docs/guide/safety.md).

- escape: tool output rendered as data, unable to forge a protocol tag (used by the parsers);
- detector: rules and an optional classifier scoring instructions hidden in tool output;
- policy: allow-lists, argument rules, sensitive and trusted tools;
- monitor: flags call sequences that look like a followed injection;
- guard: all of them around the tool calls of an episode, with confirmation of sensitive
  calls and the information-flow rule;
- hidden: text a person does not see but a model reads (tag characters, zero-width);
- poisoning: tool definitions screened when tools are registered (quarantine or strip);
- conversation: the user's turns classified as a whole (escalation, best-of-N noise).
"""

from ponder.tools.safety.conversation import ConversationGuard, ConversationOptions, Intent
from ponder.tools.safety.detector import Detection, EmbeddingClassifier, InjectionDetector, Rule
from ponder.tools.safety.escape import escape_untrusted, source_header, unescape_untrusted
from ponder.tools.safety.guard import Confirm, Guard, GuardOptions, GuardSession
from ponder.tools.safety.hidden import reveal, strip_hidden
from ponder.tools.safety.monitor import MonitorFlag, TrajectoryMonitor, events_from_turns
from ponder.tools.safety.poisoning import ScreenOptions, ToolScreen, ToolVerdict, screen_tools
from ponder.tools.safety.policy import ArgumentRule, SafetyPolicy, ToolRule

__all__ = [
    "ArgumentRule",
    "Confirm",
    "ConversationGuard",
    "ConversationOptions",
    "Detection",
    "EmbeddingClassifier",
    "Guard",
    "GuardOptions",
    "GuardSession",
    "InjectionDetector",
    "Intent",
    "MonitorFlag",
    "Rule",
    "SafetyPolicy",
    "ScreenOptions",
    "ToolRule",
    "ToolScreen",
    "ToolVerdict",
    "TrajectoryMonitor",
    "escape_untrusted",
    "events_from_turns",
    "reveal",
    "screen_tools",
    "source_header",
    "strip_hidden",
    "unescape_untrusted",
]
