"""A URLconf mounting the ACS endpoint twice (default limits, a small body limit), for the endpoint's tests."""
from django.urls import path

from ctrlrun.views import acs_endpoint

urlpatterns = [
    path("acs", acs_endpoint()),
    path("acs-small", acs_endpoint(max_body_bytes=2048, approver_id="console")),
]
