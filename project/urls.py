from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ctrlrun/", include("ctrlrun.urls")),  # the webhook answers' endpoint (docs/approvals.md#webhooks)
]
