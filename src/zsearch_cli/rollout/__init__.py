"""Multi-turn rollout: action protocols (this package's ``protocols``) and the engine."""

from zsearch_cli.rollout.protocols import (
    PROTOCOLS,
    Action,
    Protocol,
    TagsProtocol,
    ToolCallProtocol,
    get_protocol,
)

__all__ = [
    "PROTOCOLS",
    "Action",
    "Protocol",
    "TagsProtocol",
    "ToolCallProtocol",
    "get_protocol",
]
