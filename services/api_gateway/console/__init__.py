"""The web console served by the api-gateway at `/ui/` (docs/console.md)."""
