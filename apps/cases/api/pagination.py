from apps.core.api.pagination import StablePageNumberPagination


class FilePagination(StablePageNumberPagination):
    """The standard page of a case's files, plus ``unlisted``: how many files of the workspace
    are not listed because their names are not UTF-8 text (:class:`apps.cases.workspace.FileListing`)."""

    unlisted = 0

    def get_paginated_response(self, data):
        response = super().get_paginated_response(data)
        response.data["unlisted"] = self.unlisted
        return response

    def get_paginated_response_schema(self, schema):
        out = super().get_paginated_response_schema(schema)
        out["properties"]["unlisted"] = {
            "type": "integer",
            "example": 0,
            "description": "Files not listed (nor served) because their names are not UTF-8 text.",
        }
        out["required"] = [*out.get("required", []), "unlisted"]
        return out
