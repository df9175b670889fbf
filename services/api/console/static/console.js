// The console's one script (no external assets, no inline code: the CSP allows scripts from /ui/static only).
// It only shows that work is under way; every page and form works without it.
//
// A link marked data-busy (an export made on its first download, 9-14 s) is fetched here while a note says so,
// then saved under the name the server gave it; any answer but 200 is opened as a page (the console's error page).
// A form's button marked busy-on-submit shows its data-busy text while the form is being posted.
"use strict";

function busyNote(anchor, text) {
  let note = document.getElementById("busy-note");
  if (!note) {
    note = document.createElement("p");
    note.id = "busy-note";
    note.setAttribute("role", "status");
    anchor.insertAdjacentElement("afterend", note);
  }
  note.className = "busy";
  note.textContent = text;
  return note;
}

function savedName(response, fallback) {
  const header = response.headers.get("content-disposition") || "";
  const star = /filename\*=(?:UTF-8'')?([^;]+)/i.exec(header);
  if (star) { try { return decodeURIComponent(star[1].trim()); } catch (e) { /* the plain name below */ } }
  const plain = /filename="?([^";]+)"?/i.exec(header);
  return plain ? plain[1] : fallback;
}

async function busyDownload(event) {
  const link = event.currentTarget;
  if (link.dataset.running === "1") { event.preventDefault(); return; }
  event.preventDefault();
  link.dataset.running = "1";
  link.setAttribute("aria-busy", "true");
  const note = busyNote(link.closest(".actions") || link, link.dataset.busy);
  try {
    const response = await fetch(link.href, { credentials: "same-origin" });
    if (!response.ok) { window.location.assign(link.href); return; }
    const blob = await response.blob();
    const url = URL.createObjectURL(blob);
    const save = document.createElement("a");
    save.href = url;
    save.download = savedName(response, "download");
    document.body.appendChild(save);
    save.click();
    save.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
    note.className = "ok";
    note.textContent = "Done: " + save.download + " is downloaded (reload the page for its sha256 and parity).";
    delete link.dataset.busy;  // made now: a next click is a plain download
  } catch (e) {
    window.location.assign(link.href);
  } finally {
    link.dataset.running = "";
    link.removeAttribute("aria-busy");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const link of document.querySelectorAll("a[data-busy]")) {
    link.addEventListener("click", (event) => { if (link.dataset.busy) busyDownload(event); });
  }
  for (const button of document.querySelectorAll("button.busy-on-submit")) {
    button.form.addEventListener("submit", () => {
      busyNote(button, button.dataset.busy);
      button.disabled = true;
    });
  }
});
