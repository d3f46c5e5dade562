// leasegate console: the little that is not plain HTML. The pages work
// without it; it only asks before destructive actions (cancel a run).
"use strict";
document.addEventListener("submit", (event) => {
  const button = event.submitter;
  const question = button && button.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});
