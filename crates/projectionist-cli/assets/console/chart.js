// The console's lag charts (offsets behind, seconds behind): /console/lag.json drawn with
// uPlot, fetched again every 5 s. The page works without them; only the charts need
// JavaScript.
(function () {
  "use strict";
  if (typeof uPlot === "undefined") return;
  var palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

  // One chart in `box`, of the unit its data-unit names.
  function chart(box) {
    var unit = box.getAttribute("data-unit") === "seconds" ? "seconds" : "offsets";
    var plot = null;

    function data(lag) {
      var rows = [lag.t];
      lag.series.forEach(function (s) { rows.push(s[unit]); });
      return rows;
    }

    // At least the last minute on the time axis, so that one sample is not drawn across years.
    function lastMinute(lag) {
      var t = lag.t;
      if (t.length) plot.setScale("x", { min: Math.min(t[0], t[t.length - 1] - 60), max: t[t.length - 1] });
    }

    return function draw(lag) {
      if (plot && plot.series.length === lag.series.length + 1) {
        plot.setData(data(lag), false);
        lastMinute(lag);
        return;
      }
      if (plot) plot.destroy();
      var series = [{}].concat(lag.series.map(function (s, i) {
        return { label: s.label, stroke: palette[i % palette.length], width: 2, spanGaps: false };
      }));
      plot = new uPlot({
        width: Math.max(box.clientWidth, 320),
        height: 220,
        series: series,
        axes: [{}, { label: unit === "seconds" ? "seconds behind" : "offsets behind" }],
        scales: { y: { range: function (u, min, max) { return [0, Math.max(max, 1)]; } } },
      }, data(lag), box);
      lastMinute(lag);
    };
  }

  var charts = Array.prototype.map.call(document.querySelectorAll(".lag-chart"), chart);
  if (!charts.length) return;

  function refresh() {
    fetch("/console/lag.json", { cache: "no-store" })
      .then(function (r) { return r.json(); })
      .then(function (lag) { charts.forEach(function (draw) { draw(lag); }); })
      .catch(function () {});
  }

  refresh();
  setInterval(refresh, 5000);
})();
