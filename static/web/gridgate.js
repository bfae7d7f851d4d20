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
      p.textContent = "The launch dialog could not be loaded. Close it and try again in a moment.";
      target.appendChild(p);
    }
  });

  // A form that ends something (release a session, cancel a case or a job) asks first.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  }, true);

  // The launch dialog: each opening starts from a clean body (no stale "Launch" button to land
  // on), and once its content arrives focus goes to the first option, else the summary heading,
  // never to the Launch button (Enter twice must not launch unread).
  document.addEventListener("close", function (event) {
    var dialog = event.target;
    if (dialog.id !== "launch-dialog") return;
    var body = document.getElementById("launch-dialog-body");
    if (body) body.innerHTML = "<p>Asking the backend for its launch options…</p>";
  }, true);
  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail.target;
    if (!target || target.id !== "launch-dialog-body") return;
    var first = target.querySelector("[data-first-field]") || target.querySelector("#summary-h") ||
      target.querySelector("h2");
    if (first) {
      if (!first.hasAttribute("tabindex") && first.tagName.match(/^H\d$/)) first.setAttribute("tabindex", "-1");
      first.focus();
    }
  });

  // The job form says what will be sent, and an example brings its own number of shots.
  function describeJobSource(form) {
    var output = form.querySelector("#job-source");
    if (!output) return;
    var file = form.querySelector("input[type=file]");
    var example = form.querySelector("select[name=example]");
    if (file && file.files && file.files.length) {
      output.textContent = "the uploaded file “" + file.files[0].name + "” (the example is ignored)";
    } else if (example && example.value) {
      output.textContent = "the example “" + example.value + "”";
    } else {
      output.textContent = "nothing yet: pick an example or upload a file";
    }
  }
  document.addEventListener("change", function (event) {
    var form = event.target.closest && event.target.closest("form[data-job-form]");
    if (!form) return;
    if (event.target.name === "example" && event.target.value) {
      var data = document.getElementById("example-shots");
      var shots = data ? JSON.parse(data.textContent)[event.target.value] : null;
      var field = form.querySelector("input[name=shots]");
      if (shots && field) field.value = shots;
    }
    describeJobSource(form);
  });

  // A refusal shown with the page (e.g. a session that did not fit) is scrolled to and read out.
  window.addEventListener("load", function () {
    var target = document.querySelector("[data-focus-on-load]");
    if (target) {
      target.scrollIntoView({block: "center"});
      target.focus({preventScroll: true});
    }
  });
})();
