from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("pgqueue.urls")),
]

# The API is served at the root: unknown paths and failures answer in JSON too.
handler404 = "pgqueue.api.errors.not_found"
handler500 = "pgqueue.api.errors.server_error"
