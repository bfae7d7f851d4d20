// Gridgate user pages: the few behaviours htmx attributes do not cover. No framework, no build.
(function () {
  "use strict";

  document.addEventListener("click", function (event) {
    // A button that opens a dialog shows it at once; htmx fills it when the fragment arrives.
    var opener = event.target.closest("[data-opens-dialog]");
    if (opener) {
      var dialog = document.getElementById(opener.dataset.opensDialog);
      if (dialog && !dialog.open) dialog.showModal();
    }
    var closer = event.target.closest("[data-closes-dialog]");
    if (closer) {
      var target = document.getElementById(closer.dataset.closesDialog);
      if (target) target.close();
    }
  });

  // The launch dialog's summary follows the choices before the Launch button is pressed.
  document.addEventListener("change", function (event) {
    var field = event.target;
    if (!field.matches || !field.matches("[data-summary]")) return;
    var output = document.getElementById(field.dataset.summary);
    if (!output) return;
    output.textContent = field.tagName === "SELECT" ? field.options[field.selectedIndex].text : field.value || "backend default";
  });

  // A fragment that could not be fetched says so instead of leaving a stale "loading" text.
  document.addEventListener("htmx:responseError", function (event) {
    var target = event.detail.target;
    if (target && target.id === "launch-dialog-body") {
      target.innerHTML = "";
      var p = document.createElement("p");
      p.className = "msg msg-error";
      p.setAttribute("role", "alert");
      p.textContent = "The launch dialog could not be loaded (HTTP " + event.detail.xhr.status + ").";
      target.appendChild(p);
    }
  });
})();
