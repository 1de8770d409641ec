#pragma once
// Chart widgets over Qt Charts: line charts that grow as points arrive (axes follow the
// data), a per-tier memory chart stacked by what holds the memory, and the disk tier's chunk
// traffic. Series colours are fixed (so two runs compare the same way everywhere); everything
// else follows the palette.
//
// Qt Charts elides axis labels to "…" and cuts legend entries when a chart is small, so each
// chart here draws its legend as wrapping text outside the plot (under it, or beside it when
// there is room), picks its tick counts from the size it gets, and drops the axis titles when
// the plot is short (the chart's title names the unit).
#include <QChartView>
#include <QColor>
#include <QFrame>
#include <QHash>
#include <QList>
#include <QPointF>
#include <QString>
#include <utility>

class QBoxLayout;
class QCategoryAxis;
class QCheckBox;
class QLabel;
class QLineSeries;
class QValueAxis;
class QAreaSeries;

namespace tessera::ui {

struct MemorySample;

// Colours picked for contrast on both light and dark backgrounds.
QColor series_color(int index);

// Applies the widget palette to a chart (background, text, grid).
void apply_palette(QChart* chart, const QPalette& palette);

// Bytes in binary units with three significant digits: "512 B", "1.50 KiB", "159 MiB".
QString format_bytes(double bytes);

// The frame every chart here shares: a QChartView with Qt's own legend hidden, the legend as
// wrapping rich text, and two value axes (ranges 0…1 until data comes) re-ticked on resize.
class ChartView : public QFrame {
  Q_OBJECT
 public:
  struct LegendEntry {
    QString name;
    QColor color;
    enum class Mark { Area, Line, Dashed, Faint } mark = Mark::Line;
    QString value;  // the latest figure ("120 MiB"), shown after the name; may be empty
  };
  QChart* chart() const;
  QChartView* view() const { return view_; }
  QString legend_text() const;  // the legend as plain text ("weights 120 MiB · budget 1 GiB")
  QLabel* legend_label() const { return legend_; }
  int x_tick_count() const { return x_ticks_; }
  int y_tick_count() const { return y_ticks_; }

 protected:
  ChartView(const QString& x_title, const QString& y_title, QWidget* parent);
  void set_legend(const QList<LegendEntry>& entries);
  // A row of controls above the plot (the loss chart's log-scale box), aligned right.
  void add_control(QWidget* control);
  // Legend beside the plot (right) when the chart is wide enough; under it otherwise.
  void set_legend_beside_when_wide(bool beside) { legend_beside_ = beside; }
  // The axes' ranges are set again for the current tick counts (charts keep their data extents).
  virtual void update_ranges() = 0;
  void resizeEvent(QResizeEvent* event) override;
  void changeEvent(QEvent* event) override;
  QValueAxis* x_axis_ = nullptr;  // both made by the constructor
  QValueAxis* y_axis_ = nullptr;

 private:
  void fit_to_size();
  void render_legend();
  QChartView* view_ = nullptr;  // (palette and font events arrive while constructing)
  QLabel* legend_ = nullptr;
  QBoxLayout* layout_ = nullptr;
  QWidget* controls_ = nullptr;  // made by the first add_control
  QList<LegendEntry> legend_entries_;
  bool legend_beside_ = false;     // allowed
  bool legend_is_beside_ = false;  // now
  int x_ticks_ = 5, y_ticks_ = 5;
};

class LineChart : public ChartView {
  Q_OBJECT
 public:
  LineChart(const QString& title, const QString& x_label, const QString& y_label,
            QWidget* parent = nullptr);
  // Declares a series before its first point: its colour index and whether it is drawn faint
  // (the raw values under a smoothed line). Series not declared get the next colour.
  void define_series(const QString& series, int color, bool faint);
  // Adds points to the named series (created on first use, in call order).
  void append(const QString& series, const QList<QPointF>& points);
  void clear();
  int point_count(const QString& series) const;
  int series_count() const { return int(series_.size()); }
  void set_empty_text(const QString& text);  // shown in the title while there is no point
  // Offers a "log scale" box above the plot (a loss falls by orders of magnitude, and its late
  // steps flatten into the axis on a linear one). Off until ticked.
  void offer_log_scale();
  QCheckBox* log_scale_box() const { return log_box_; }
  // A logarithmic y axis (once offered): the series plot log10 of their values, the axis is
  // labelled in the values themselves ("0.5, 1, 2, 5"); points at or below zero are left out
  // while it is on.
  void set_log_scale(bool on);
  bool log_scale() const { return log_; }
  // The points drawn for `series` (log10 of the values on a log scale).
  QList<QPointF> shown_points(const QString& series) const;
  // The y axis's labelled values on a log scale, with where each is drawn (log10 of it).
  QList<std::pair<QString, double>> log_ticks() const;

 protected:
  void update_ranges() override;

 private:
  struct Style {
    int color = 0;
    bool faint = false;
  };
  QLineSeries* series_for(const QString& name);
  void update_title();
  void update_legend();
  void draw(QLineSeries* series, const QList<QPointF>& values);  // transformed as the scale is
  void extend_extents(const QList<QPointF>& values);
  void cover_y(bool reset);
  QString title_, empty_text_;
  QHash<QString, QLineSeries*> series_;
  QHash<QString, QList<QPointF>> values_;  // with a log scale offered: every finite point given
  QList<QString> order_;                   // series in creation order (the legend's order)
  QHash<QString, Style> styles_;           // declared or assigned styles
  double x_min_ = 0, x_max_ = 0, y_min_ = 0, y_max_ = 0;  // y: of the drawn (log10) values
  bool has_points_ = false;
  bool has_y_ = false;  // a drawn y value (a log scale drops those at or below zero)
  bool log_ = false;
  QCheckBox* log_box_ = nullptr;
  QCategoryAxis* log_axis_ = nullptr;  // made with the first switch to the log scale
};

// One memory tier over time, stacked by category (weights, gradients, optimizer state,
// activations and other), with the tier's budget as a dashed line when reported, the machine's
// memory in use (host) and the plan's estimated peak as lines. The legend lists each category
// and line with its latest figure (a small model's weights are a sliver of the plot, not of the
// numbers); a category or line is listed (and drawn) once it has held something and stays
// listed: the legend only grows, in a fixed order.
class MemoryChart : public ChartView {
  Q_OBJECT
 public:
  MemoryChart(const QString& tier, QWidget* parent = nullptr);
  void append(const QList<MemorySample>& samples, double t0);
  int point_count() const;
  int system_point_count() const;
  // Bytes of `category` (memory_categories()) in the latest sample drawn; kMissing: none.
  double last_bytes(int category) const;
  bool category_shown(int category) const;  // drawn and listed in the legend
  // The plan's estimated peak of this tier, drawn across the chart (0: none).
  void set_estimate(double bytes);
  double estimate() const { return estimate_bytes_; }
  QString unit() const;  // of the y axis: "MiB" or "GiB" (named in the chart's title too)
  void clear();

 protected:
  void update_ranges() override;

 private:
  void update_legend();
  QString tier_;
  QList<QLineSeries*> uppers_;  // cumulative, one per category
  QList<QAreaSeries*> areas_;
  QLineSeries* budget_;
  QLineSeries* system_;
  QLineSeries* estimate_;
  double x_max_ = 0, y_max_ = 0;
  double estimate_bytes_ = 0;
  // Bytes per unit of the y values: MiB, and GiB once the tier holds 10 GiB or more (a large
  // model's host tier read "60000").
  double unit_bytes_ = 1024.0 * 1024.0;
  void set_unit(double unit_bytes);
  bool shown_[4] = {false, false, false, false};  // categories that have held something
  bool estimate_listed_ = false;                  // once listed, the estimate stays listed
  void draw_estimate();
  void add_line(QLineSeries* series, const QString& name, int color, Qt::PenStyle style);
};

// The disk tier's chunk traffic over time: bytes per second read from disk into host memory
// and written from host memory to disk, on an axis in binary units (B/s … GiB/s) that follows
// the largest rate.
class TrafficChart : public ChartView {
  Q_OBJECT
 public:
  enum class Direction { DiskToHost, HostToDisk };
  explicit TrafficChart(QWidget* parent = nullptr);
  // Takes the rates of the disk-tier samples that report traffic.
  void append(const QList<MemorySample>& samples, double t0);
  int point_count() const;
  double last_rate(Direction direction) const;  // bytes/s of the latest point; kMissing: none
  QString unit() const;                         // of the y axis: "MiB/s", …
  void clear();

 protected:
  void update_ranges() override;

 private:
  void set_unit(double bytes_per_unit);
  void update_legend();
  QLineSeries* read_;
  QLineSeries* written_;
  double x_max_ = 0, y_max_bytes_ = 0;  // y in bytes/s
  double bytes_per_unit_ = 1;           // a power of 1024: scaling is exact
};

}  // namespace tessera::ui
