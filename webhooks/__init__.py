"""Webhooks: event payloads, Standard Webhooks signing, URL safety and delivery.

Imports nothing else of Barge's; the delivery task in ``queueing`` drives it.
"""

from webhooks.deliver import DeliveryResult, send
from webhooks.events import EVENT_TYPES, OPT_IN_EVENT_TYPES, WebhookEvent, job_event
from webhooks.retry import RetryPolicy, next_delay, retry_delay
from webhooks.safety import UnsafeDestinationError, check_destination, validate_webhook_url
from webhooks.signing import WebhookVerificationError, generate_secret, headers, sign, verify

__all__ = [
    "EVENT_TYPES",
    "OPT_IN_EVENT_TYPES",
    "DeliveryResult",
    "RetryPolicy",
    "UnsafeDestinationError",
    "WebhookEvent",
    "WebhookVerificationError",
    "check_destination",
    "generate_secret",
    "headers",
    "job_event",
    "next_delay",
    "retry_delay",
    "send",
    "sign",
    "validate_webhook_url",
    "verify",
]
