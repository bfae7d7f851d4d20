from rest_framework.pagination import PageNumberPagination


class StablePageNumberPagination(PageNumberPagination):
    """``?page=`` and ``?page_size=`` (at most 500). Views order by a unique key so pages are stable."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
