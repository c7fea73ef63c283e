"""Webhooks: event payloads, Standard Webhooks signing, URL safety and delivery.

Imports nothing else of Barge's; the delivery task in ``queueing`` drives it.
"""

from webhooks.deliver import DeliveryResult, retry_delay, send
from webhooks.events import EVENT_TYPES, WebhookEvent, job_event
from webhooks.safety import UnsafeDestinationError, check_destination, validate_webhook_url
from webhooks.signing import WebhookVerificationError, generate_secret, headers, sign, verify

__all__ = [
    "EVENT_TYPES",
    "DeliveryResult",
    "UnsafeDestinationError",
    "WebhookEvent",
    "WebhookVerificationError",
    "check_destination",
    "generate_secret",
    "headers",
    "job_event",
    "retry_delay",
    "send",
    "sign",
    "validate_webhook_url",
    "verify",
]
