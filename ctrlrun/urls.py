"""ctrlrun's own URLs, for a project to include: ``path("ctrlrun/", include("ctrlrun.urls"))``.

- ``approvals/<request_id>`` (POST): a signed webhook answer to an approval request
  (``ctrlrun.webhook.handle_inbound``); with the include above it is the ``respond_to`` address
  ``WebhookApprovalProvider(public_url=...)`` announces.
"""
from django.urls import path

from . import views

app_name = "ctrlrun"
urlpatterns = [
    path("approvals/<str:request_id>", views.webhook_answer, name="webhook-answer"),
]
